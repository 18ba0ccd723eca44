// Uploads a local file (a checkpoint, a log) to Amazon S3 or an S3-compatible store (MinIO, moto), signing
// every request with AWS Signature Version 4. Files up to `part_size` go in one PUT; larger files go as a
// multipart upload, read one part at a time, so a multi-GB checkpoint never sits in memory whole.
//
//   auto opt = cohort::upload::S3Options::from_env(/*endpoint_flag=*/"http://127.0.0.1:9000");
//   auto dest = cohort::upload::S3Url::parse("s3://my-bucket/runs/exp1/");
//   uint64_t bytes = cohort::upload::upload_file(opt, dest, "ckpt/model.safetensors");
//   // -> s3://my-bucket/runs/exp1/model.safetensors; throws cohort::upload::UploadError on failure
//
// Every request is signed by upload/SigV4.h (included here, where its functions were declared before).
#pragma once

#include "cohort/upload/SigV4.h"
#include "cohort/util/Http.h"

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "cohort/util/Error.h"

namespace cohort::upload {

// An upload that failed: bad URL or credentials, a file that cannot be read, an HTTP error from the store.
class UploadError : public Error {
  using Error::Error;
};

// "s3://bucket/some/key". The key may be empty or end in '/', in which case upload_file appends the file name.
struct S3Url {
  std::string bucket;
  std::string key;

  // Throws UploadError (with a hint) for anything but "s3://<valid bucket name>[/<key>]".
  static S3Url parse(const std::string& url);
  std::string str() const { return "s3://" + bucket + "/" + key; }
};

struct S3Options {
  std::string endpoint;  // e.g. "http://127.0.0.1:5000"; empty: https://s3.<region>.amazonaws.com
  std::string region = "us-east-1";
  std::string access_key, secret_key, session_token;
  size_t part_size = 8 << 20;      // multipart above this size (real S3 wants >= 5 MiB for all but the last part)
  int max_attempts = 5;            // per request; retried on network errors, 5xx, 429 and RequestTimeout only
  double backoff_initial_s = 0.2;  // doubles after each failed attempt
  bool path_style = true;          // http://endpoint/bucket/key (what moto and MinIO want); else bucket.endpoint/key

  // Reads AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION (else AWS_DEFAULT_REGION),
  // and AWS_ENDPOINT_URL_S3 (else AWS_ENDPOINT_URL); a non-empty `endpoint_flag` (--s3-endpoint) wins over
  // both. Throws UploadError naming the variables when the credentials are missing.
  static S3Options from_env(const std::string& endpoint_flag = "");
};

// ---- Upload ----

// Uploads `file` to dest (a key that is empty or ends in '/' gets the file name appended): one PUT when the
// file has at most part_size bytes, else CreateMultipartUpload, UploadPart per part, CompleteMultipartUpload,
// and AbortMultipartUpload if anything fails. Never modifies the local file. Returns the bytes uploaded.
// Throws UploadError naming the URL, the HTTP status and the S3 error code and message, with a hint.
uint64_t upload_file(const S3Options& opt, const S3Url& dest, const std::filesystem::path& file);

}  // namespace cohort::upload

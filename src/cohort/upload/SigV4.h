// AWS Signature Version 4: the canonical request, the string to sign and the Authorization header, as
// pure functions, for the S3 client (upload/S3.h) and checked against known answers without a network
// (tests/unit/upload/test_s3.cpp).
//
//   cohort::upload::SignedRequest r{"PUT", "/bucket/key", {}, {{"host", "s3.amazonaws.com"},
//                                    {"x-amz-date", date}, {"x-amz-content-sha256", hash}}, hash, date};
//   const auto authorization = cohort::upload::authorization_header(r, key_id, secret);  // the header's value
//
// Note [Why our own SigV4 and not CURLOPT_AWS_SIGV4] in SigV4.cpp says why this is not libcurl's.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "cohort/util/Http.h"

namespace cohort::upload {

std::string sha256_hex(const std::string& data);                           // lowercase hex
std::string hmac_sha256(const std::string& key, const std::string& data);  // raw 32 bytes
std::string to_hex(const std::string& bytes);
// HMAC chain "AWS4"+secret -> date (YYYYMMDD) -> region -> service -> "aws4_request"; raw 32 bytes.
std::string signing_key(const std::string& secret, const std::string& date, const std::string& region,
                        const std::string& service);
// Percent-encodes everything but A-Z a-z 0-9 - _ . ~ (and '/' when keep_slash), as SigV4 requires.
using util::http::uri_encode;
// The current UTC time as "YYYYMMDDTHHMMSSZ".
std::string amz_date_now();

// One request as SigV4 sees it. Names and values are plain (unencoded); the canonical form encodes them.
struct SignedRequest {
  std::string method;  // "PUT", "POST", "DELETE", ...
  std::string path;    // e.g. "/bucket/runs/exp 1/model.pt"; S3 paths are encoded once, '/' kept
  std::vector<std::pair<std::string, std::string>> query;  // e.g. {{"partNumber","2"},{"uploadId","x"}}
  // Every header to sign, in any order and case. Must hold "host" and "x-amz-date" (equal to amz_date),
  // and for S3 "x-amz-content-sha256" (equal to payload_hash).
  std::vector<std::pair<std::string, std::string>> headers;
  std::string payload_hash;  // hex SHA-256 of the body, or "UNSIGNED-PAYLOAD"
  std::string amz_date;      // "YYYYMMDDTHHMMSSZ"
  std::string region = "us-east-1";
  std::string service = "s3";
};

// Letters A-Z to a-z, nothing else changed.
std::string ascii_lower(std::string s);
// A header value as SigV4 reads it: trimmed, and inner runs of spaces collapsed to one.
std::string trim_collapse(const std::string& v);

std::string canonical_query_string(const std::vector<std::pair<std::string, std::string>>& query);
std::string canonical_request(const SignedRequest& r);
std::string string_to_sign(const SignedRequest& r);
// "AWS4-HMAC-SHA256 Credential=<key>/<scope>, SignedHeaders=a;b;c, Signature=<hex>".
std::string authorization_header(const SignedRequest& r, const std::string& access_key, const std::string& secret_key);

}  // namespace cohort::upload

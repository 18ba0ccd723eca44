#include "cohort/upload/S3.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <thread>

namespace cohort::upload {

namespace fs = std::filesystem;
using Query = std::vector<std::pair<std::string, std::string>>;

// ---- URL and options ----

S3Url S3Url::parse(const std::string& url) {
  const std::string scheme = "s3://";
  const std::string example = "write it as s3://bucket/prefix, e.g. s3://my-checkpoints/runs/exp1/";
  if (url.compare(0, scheme.size(), scheme) != 0) {
    throw UploadError("S3 URL '" + url + "' does not start with s3://", example);
  }
  const std::string rest = url.substr(scheme.size());
  const size_t slash = rest.find('/');
  S3Url out;
  out.bucket = rest.substr(0, slash);
  out.key = slash == std::string::npos ? "" : rest.substr(slash + 1);
  if (out.bucket.empty()) throw UploadError("S3 URL '" + url + "' has no bucket name", example);
  // The rules of S3 bucket names: 3-63 characters of a-z 0-9 . -, starting and ending with a letter or digit.
  const auto& b = out.bucket;
  const bool chars_ok = std::all_of(b.begin(), b.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '-';
  });
  if (b.size() < 3 || b.size() > 63 || !chars_ok || !std::isalnum(static_cast<unsigned char>(b.front())) ||
      !std::isalnum(static_cast<unsigned char>(b.back()))) {
    throw UploadError("S3 URL '" + url + "' has an invalid bucket name '" + b + "'",
                      "bucket names have 3-63 characters: lowercase letters, digits, '.' and '-', starting and "
                      "ending with a letter or digit");
  }
  const bool control = std::any_of(out.key.begin(), out.key.end(),
                                   [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; });
  if ((!out.key.empty() && out.key.front() == '/') || out.key.size() > 1024 || control) {
    throw UploadError("S3 URL '" + url + "' has an invalid key (leading '/', control character or > 1024 bytes)",
                      example);
  }
  return out;
}

namespace {
std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}
}  // namespace

S3Options S3Options::from_env(const std::string& endpoint_flag) {
  S3Options o;
  o.access_key = env_or_empty("AWS_ACCESS_KEY_ID");
  o.secret_key = env_or_empty("AWS_SECRET_ACCESS_KEY");
  o.session_token = env_or_empty("AWS_SESSION_TOKEN");
  if (o.access_key.empty() || o.secret_key.empty()) {
    throw UploadError("S3 credentials missing: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY must both be set (" +
                          std::string(o.access_key.empty() ? "AWS_ACCESS_KEY_ID" : "AWS_SECRET_ACCESS_KEY") +
                          " is not)",
                      "export AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (plus AWS_SESSION_TOKEN for temporary "
                      "credentials) before uploading to s3://");
  }
  std::string region = env_or_empty("AWS_REGION");
  if (region.empty()) region = env_or_empty("AWS_DEFAULT_REGION");
  if (!region.empty()) o.region = region;
  o.endpoint = endpoint_flag;
  if (o.endpoint.empty()) o.endpoint = env_or_empty("AWS_ENDPOINT_URL_S3");
  if (o.endpoint.empty()) o.endpoint = env_or_empty("AWS_ENDPOINT_URL");
  return o;
}

// ---- HTTP ----

namespace {

constexpr double kMaxBackoffS = 30.0;
constexpr uint64_t kMaxParts = 10000;  // S3's limit on parts per multipart upload

struct Endpoint {
  std::string scheme;  // "http" or "https"
  std::string host;    // host[:port], exactly what goes in the Host header
  std::string prefix;  // a path before the bucket, usually empty
};

Endpoint parse_endpoint(const S3Options& opt) {
  const std::string e = opt.endpoint.empty() ? "https://s3." + opt.region + ".amazonaws.com" : opt.endpoint;
  const std::string hint =
      "write the endpoint as http://host:port or https://host (--s3-endpoint, AWS_ENDPOINT_URL_S3)";
  const size_t p = e.find("://");
  if (p == std::string::npos) throw UploadError("S3 endpoint '" + e + "' has no http:// or https://", hint);
  Endpoint out;
  out.scheme = ascii_lower(e.substr(0, p));
  if (out.scheme != "http" && out.scheme != "https") {
    throw UploadError("S3 endpoint '" + e + "' must use http or https", hint);
  }
  const std::string rest = e.substr(p + 3);
  const size_t slash = rest.find('/');
  out.host = rest.substr(0, slash);
  if (slash != std::string::npos) out.prefix = rest.substr(slash);
  while (!out.prefix.empty() && out.prefix.back() == '/') out.prefix.pop_back();
  if (out.host.empty() || out.host.find_first_of("?#@ ") != std::string::npos) {
    throw UploadError("S3 endpoint '" + e + "' has no valid host", hint);
  }
  return out;
}

std::string xml_unescape(std::string s) {
  const std::pair<const char*, const char*> entities[] = {
      {"&quot;", "\""}, {"&apos;", "'"}, {"&lt;", "<"}, {"&gt;", ">"}, {"&amp;", "&"}};
  for (const auto& [from, to] : entities) {
    for (size_t pos = 0; (pos = s.find(from, pos)) != std::string::npos; pos += std::strlen(to)) {
      s.replace(pos, std::strlen(from), to);
    }
  }
  return s;
}

// The text of the first <tag>...</tag>; enough for S3's flat Error and UploadId answers.
std::string xml_text(const std::string& xml, const std::string& tag) {
  const size_t open = xml.find("<" + tag + ">");
  if (open == std::string::npos) return "";
  const size_t begin = open + tag.size() + 2;
  const size_t close = xml.find("</" + tag + ">", begin);
  return close == std::string::npos ? "" : xml_unescape(xml.substr(begin, close - begin));
}

struct Response : util::http::Response {
  // S3 can answer CompleteMultipartUpload with 200 and an <Error> body, so a 2xx is not enough.
  bool ok() const { return reached() && status / 100 == 2 && body.find("<Error>") == std::string::npos; }
  std::string code() const { return xml_text(body, "Code"); }
  std::string etag() const { return trim_collapse(header("etag")); }
};

bool retryable(const Response& r) {
  if (!r.reached()) return r.transport_retryable();
  const std::string code = r.code();
  return r.status >= 500 || r.status == 429 || code == "RequestTimeout" || code == "InternalError" ||
         code == "SlowDown";
}

std::string hint_for(const Response& r, const S3Options& opt) {
  static const std::pair<const char*, const char*> kByCode[] = {
      {"SignatureDoesNotMatch", "the secret does not match the access key: check AWS_SECRET_ACCESS_KEY"},
      {"InvalidAccessKeyId", "the store does not know this access key: check AWS_ACCESS_KEY_ID and the endpoint"},
      {"ExpiredToken", "the temporary credentials expired: refresh them and AWS_SESSION_TOKEN"},
      {"InvalidToken", "check AWS_SESSION_TOKEN (it must belong to AWS_ACCESS_KEY_ID)"},
      {"RequestTimeTooSkewed", "this machine's clock is off by more than 15 minutes: sync it (NTP)"},
      {"NoSuchBucket", "create the bucket first (aws s3 mb s3://<bucket>) or fix its name in the URL"},
      {"EntityTooSmall", "every part but the last must be at least 5 MiB: raise the part size"},
  };
  const std::string code = r.code();
  if (!r.reached()) {
    return "check that the endpoint is reachable from this machine (--s3-endpoint, AWS_ENDPOINT_URL_S3, "
           "AWS_ENDPOINT_URL)";
  }
  for (const auto& [c, hint] : kByCode) {
    if (code == c) return hint;
  }
  if (code == "AuthorizationHeaderMalformed" || code == "PermanentRedirect" || r.status == 301 || r.status == 307) {
    return "the bucket is in another region: set AWS_REGION to the bucket's region (now '" + opt.region + "')";
  }
  if (r.status == 403) return "the credentials may not write here: allow s3:PutObject and s3:AbortMultipartUpload";
  if (r.status >= 500 || r.status == 429) return "the store kept failing; try again later";
  return "see the S3 error code and message above";
}

// One upload: an HTTP session (reused, so connections are kept alive), the endpoint and the destination.
class Session {
 public:
  Session(const S3Options& opt, std::string bucket, std::string key, std::string what)
      : opt_(opt),
        endpoint_(parse_endpoint(opt)),
        bucket_(std::move(bucket)),
        key_(std::move(key)),
        what_(std::move(what)) {}

  // Sends one signed request, retrying with exponential backoff; throws UploadError when it fails for good.
  Response request(const std::string& step, const std::string& method, const Query& query,
                   const std::string& content_type, const std::string& body) {
    const std::string payload_hash = sha256_hex(body);
    const int attempts = std::max(1, opt_.max_attempts);
    double backoff = opt_.backoff_initial_s;
    for (int attempt = 1;; ++attempt) {
      Response r = attempt_once(method, query, content_type, body, payload_hash);
      if (r.ok()) return r;
      if (attempt >= attempts || !retryable(r)) {
        std::string msg = what_ + " failed: " + step + " (" + method + " " + url(query) + ") " + describe(r);
        if (attempt > 1) msg += " (after " + std::to_string(attempt) + " attempts)";
        throw UploadError(msg, hint_for(r, opt_));
      }
      std::cerr << "cohort: note: S3 " << step << " " << describe(r) << "; retry " << attempt + 1 << "/" << attempts
                << " in " << backoff << " s" << std::endl;
      std::this_thread::sleep_for(std::chrono::duration<double>(backoff));
      backoff = std::min(backoff * 2, kMaxBackoffS);
    }
  }

  std::string url(const Query& query) const {
    const std::string qs = canonical_query_string(query);
    return endpoint_.scheme + "://" + host() + uri_encode(path(), true) + (qs.empty() ? "" : "?" + qs);
  }

 private:
  std::string host() const { return opt_.path_style ? endpoint_.host : bucket_ + "." + endpoint_.host; }
  std::string path() const { return endpoint_.prefix + (opt_.path_style ? "/" + bucket_ + "/" + key_ : "/" + key_); }

  static std::string describe(const Response& r) {
    if (!r.reached()) return "could not talk to the store: " + r.transport_error();
    const std::string code = r.code(), message = xml_text(r.body, "Message");
    if (code.empty() && message.empty())
      return "answered HTTP " + std::to_string(r.status) + " " + r.body.substr(0, 200);
    return "answered HTTP " + std::to_string(r.status) + " " + code + ": " + message;
  }

  Response attempt_once(const std::string& method, const Query& query, const std::string& content_type,
                        const std::string& body, const std::string& payload_hash) {
    SignedRequest sr;
    sr.method = method;
    sr.path = path();
    sr.query = query;
    sr.payload_hash = payload_hash;
    sr.amz_date = amz_date_now();  // signed again on every attempt, so a long backoff never goes stale
    sr.region = opt_.region;
    sr.headers = {{"host", host()}, {"x-amz-date", sr.amz_date}, {"x-amz-content-sha256", payload_hash}};
    if (!content_type.empty()) sr.headers.emplace_back("content-type", content_type);
    if (!opt_.session_token.empty()) sr.headers.emplace_back("x-amz-security-token", opt_.session_token);

    util::http::Request request{method, url(query), {}, (method == "PUT" || method == "POST") ? &body : nullptr};
    for (const auto& [name, value] : sr.headers) request.headers.push_back(name + ": " + value);
    request.headers.push_back("Authorization: " + authorization_header(sr, opt_.access_key, opt_.secret_key));
    request.headers.push_back("Expect:");  // no 100-continue round trip; S3 answers errors after the body anyway
    if (content_type.empty()) request.headers.push_back("Content-Type:");  // keep curl's form default off the object
    Response r;
    static_cast<util::http::Response&>(r) = http_.perform(request);
    return r;
  }

  const S3Options& opt_;
  Endpoint endpoint_;
  std::string bucket_, key_, what_;
  util::http::Session http_;
};

// Reads bytes [offset, offset + n) of the file; the file is opened read-only and never written.
std::string read_part(std::ifstream& in, const fs::path& file, uint64_t offset, uint64_t n) {
  std::string buf(n, '\0');
  in.seekg(static_cast<std::streamoff>(offset));
  in.read(buf.data(), static_cast<std::streamsize>(n));
  if (static_cast<uint64_t>(in.gcount()) != n) {
    throw UploadError("could not read " + std::to_string(n) + " bytes at offset " + std::to_string(offset) + " of " +
                          file.string() + " (the file shrank or a read failed)",
                      "do not modify the file while it is being uploaded");
  }
  return buf;
}

}  // namespace

// ---- Upload ----

uint64_t upload_file(const S3Options& opt, const S3Url& dest, const fs::path& file) {
  if (opt.access_key.empty() || opt.secret_key.empty()) {
    throw UploadError("no S3 credentials for uploading to " + dest.str(),
                      "export AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (S3Options::from_env reads them)");
  }
  if (opt.part_size == 0) throw UploadError("S3 part size must be positive, got 0", "use at least 5 MiB");
  std::error_code ec;
  const bool regular = fs::is_regular_file(file, ec);
  const uint64_t size = regular ? fs::file_size(file, ec) : 0;
  std::ifstream in(file, std::ios::binary);  // read-only: the file is never modified
  if (!regular || ec || !in) {
    throw UploadError("cannot upload " + file.string() + ": not a readable regular file",
                      "check the path and permissions of the file to upload");
  }

  S3Url target = dest;
  if (target.key.empty() || target.key.back() == '/') target.key += file.filename().string();
  Session s3(opt, target.bucket, target.key, "S3 upload of " + file.string() + " to " + target.str());

  if (size <= opt.part_size) {
    s3.request("PutObject", "PUT", {}, "application/octet-stream", read_part(in, file, 0, size));
    return size;
  }

  // S3 allows at most 10000 parts: a part size too small for the file is raised (in whole MiB) to fit.
  uint64_t part_size = opt.part_size;
  const uint64_t mib = 1 << 20;
  if ((size + part_size - 1) / part_size > kMaxParts)
    part_size = ((size + kMaxParts - 1) / kMaxParts + mib - 1) / mib * mib;

  const Response created =
      s3.request("CreateMultipartUpload", "POST", {{"uploads", ""}}, "application/octet-stream", "");
  const std::string upload_id = xml_text(created.body, "UploadId");
  if (upload_id.empty()) {
    throw UploadError("S3 upload of " + file.string() + " to " + target.str() +
                          ": CreateMultipartUpload answered without an UploadId: " + created.body.substr(0, 200),
                      "check that the endpoint is an S3-compatible store that supports multipart uploads");
  }
  const Query id = {{"uploadId", upload_id}};
  auto abort_upload = [&]() -> std::string {  // "" when the abort succeeded, else why not
    try {
      s3.request("AbortMultipartUpload", "DELETE", id, "", "");
    } catch (const UploadError& e) {
      return e.what();
    }
    return "";
  };

  try {
    std::ostringstream xml;
    xml << "<CompleteMultipartUpload xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">";
    uint64_t part = 1;
    for (uint64_t offset = 0; offset < size; offset += part_size, ++part) {
      const std::string n = std::to_string(part);
      const Response r =
          s3.request("UploadPart " + n, "PUT", {{"partNumber", n}, {"uploadId", upload_id}}, "application/octet-stream",
                     read_part(in, file, offset, std::min(part_size, size - offset)));
      if (r.etag().empty()) {
        throw UploadError("S3 upload of " + file.string() + " to " + target.str() + ": UploadPart " + n +
                              " answered without an ETag header",
                          "check that the endpoint is an S3-compatible store");
      }
      // A part's ETag is its MD5 as quoted hex: nothing in it needs escaping in XML.
      xml << "<Part><PartNumber>" << n << "</PartNumber><ETag>" << r.etag() << "</ETag></Part>";
    }
    xml << "</CompleteMultipartUpload>";
    s3.request("CompleteMultipartUpload", "POST", id, "application/xml", xml.str());
  } catch (const UploadError& e) {
    const std::string abort_error = abort_upload();
    if (abort_error.empty()) {
      throw UploadError(std::string(e.what()) + "; the incomplete multipart upload was aborted", e.hint());
    }
    throw UploadError(std::string(e.what()) + "; aborting the incomplete multipart upload also failed: " + abort_error,
                      e.hint() + "; then remove the leftover parts: aws s3api abort-multipart-upload --bucket " +
                          target.bucket + " --key '" + target.key + "' --upload-id '" + upload_id + "'");
  } catch (...) {
    abort_upload();
    throw;
  }
  return size;
}

}  // namespace cohort::upload

#include "cohort/upload/SigV4.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <algorithm>
#include <cctype>
#include <ctime>

#include "cohort/util/Error.h"

// Note [Why our own SigV4 and not CURLOPT_AWS_SIGV4]
// libcurl 7.88 can sign requests itself, but we sign here because (1) multipart uploads put
// `uploads`, `partNumber` and `uploadId` in the query string, and we want their canonical encoding and
// ordering to be ours, not whatever a given libcurl version does; (2) S3 needs an `x-amz-content-sha256`
// header that libcurl does not add (moto answers 403 without it) and which must be part of the signature;
// (3) the canonical request, string to sign and signature are pure functions here, checked in
// tests/unit/upload/test_s3.cpp against answers computed independently (AWS docs, botocore).

namespace cohort::upload {

using Query = std::vector<std::pair<std::string, std::string>>;

std::string to_hex(const std::string& bytes) {
  static const char* kDigits = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

std::string sha256_hex(const std::string& data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_Digest(data.data(), data.size(), md, &len, EVP_sha256(), nullptr) != 1) {
    throw Error("OpenSSL SHA-256 failed", "check the OpenSSL installation");
  }
  return to_hex(std::string(reinterpret_cast<char*>(md), len));
}

std::string hmac_sha256(const std::string& key, const std::string& data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (!HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(data.data()),
            data.size(), md, &len)) {
    throw Error("OpenSSL HMAC-SHA256 failed", "check the OpenSSL installation");
  }
  return std::string(reinterpret_cast<char*>(md), len);
}

std::string signing_key(const std::string& secret, const std::string& date, const std::string& region,
                        const std::string& service) {
  const std::string k_date = hmac_sha256("AWS4" + secret, date);
  const std::string k_region = hmac_sha256(k_date, region);
  const std::string k_service = hmac_sha256(k_region, service);
  return hmac_sha256(k_service, "aws4_request");
}

std::string amz_date_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y%m%dT%H%M%SZ", &tm);
  return buf;
}

std::string canonical_query_string(const Query& query) {
  Query enc;
  enc.reserve(query.size());
  for (const auto& [k, v] : query) enc.emplace_back(uri_encode(k, false), uri_encode(v, false));
  std::sort(enc.begin(), enc.end());
  std::string out;
  for (const auto& [k, v] : enc) out += (out.empty() ? "" : "&") + k + "=" + v;
  return out;
}

std::string ascii_lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Header values are trimmed and inner runs of spaces collapsed to one, as SigV4 specifies.
std::string trim_collapse(const std::string& v) {
  std::string out;
  bool space = false;
  for (char c : v) {
    if (c == ' ' || c == '\t') {
      space = !out.empty();
    } else {
      if (space) out.push_back(' ');
      space = false;
      out.push_back(c);
    }
  }
  return out;
}

namespace {

// Sorted (lowercase name, trimmed value) pairs. upload_file never repeats a header, so no joining of values.
std::vector<std::pair<std::string, std::string>> canonical_headers(const SignedRequest& r) {
  std::vector<std::pair<std::string, std::string>> h;
  for (const auto& [name, value] : r.headers) h.emplace_back(ascii_lower(name), trim_collapse(value));
  std::sort(h.begin(), h.end());
  return h;
}

std::string signed_header_names(const std::vector<std::pair<std::string, std::string>>& headers) {
  std::string out;
  for (const auto& h : headers) out += (out.empty() ? "" : ";") + h.first;
  return out;
}

std::string credential_scope(const SignedRequest& r) {
  return r.amz_date.substr(0, 8) + "/" + r.region + "/" + r.service + "/aws4_request";
}
}  // namespace

std::string canonical_request(const SignedRequest& r) {
  const auto headers = canonical_headers(r);
  std::string out =
      r.method + "\n" + uri_encode(r.path.empty() ? "/" : r.path, true) + "\n" + canonical_query_string(r.query) + "\n";
  for (const auto& [name, value] : headers) out += name + ":" + value + "\n";
  out += "\n" + signed_header_names(headers) + "\n" + r.payload_hash;
  return out;
}

std::string string_to_sign(const SignedRequest& r) {
  COHORT_ASSERT(r.amz_date.size() == 16, "SigV4 amz_date must look like 20240101T000000Z, got '" + r.amz_date + "'");
  return "AWS4-HMAC-SHA256\n" + r.amz_date + "\n" + credential_scope(r) + "\n" + sha256_hex(canonical_request(r));
}

std::string authorization_header(const SignedRequest& r, const std::string& access_key, const std::string& secret_key) {
  const std::string key = signing_key(secret_key, r.amz_date.substr(0, 8), r.region, r.service);
  const std::string signature = to_hex(hmac_sha256(key, string_to_sign(r)));
  return "AWS4-HMAC-SHA256 Credential=" + access_key + "/" + credential_scope(r) +
         ", SignedHeaders=" + signed_header_names(canonical_headers(r)) + ", Signature=" + signature;
}

}  // namespace cohort::upload

#include "cohort/util/Http.h"

#include <curl/curl.h>

#include <cctype>
#include <memory>
#include <mutex>
#include <stdexcept>

namespace cohort::util::http {

namespace {

constexpr long kConnectTimeoutS = 15;
constexpr long kLowSpeedBytesPerS = 1024;  // a transfer slower than this for kLowSpeedTimeS fails
constexpr long kLowSpeedTimeS = 60;

CURLcode global_init_result() {
  static std::once_flag once;
  static CURLcode result = CURLE_OK;
  std::call_once(once, [] { result = curl_global_init(CURL_GLOBAL_DEFAULT); });
  return result;
}

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

size_t on_body(char* data, size_t size, size_t n, void* user) {
  static_cast<Response*>(user)->body.append(data, size * n);
  return size * n;
}

size_t on_header(char* data, size_t size, size_t n, void* user) {
  auto* r = static_cast<Response*>(user);
  const std::string line(data, size * n);
  if (line.compare(0, 5, "HTTP/") == 0) r->headers.clear();  // a new answer (after a 100 Continue, a redirect)
  const size_t colon = line.find(':');
  if (colon != std::string::npos) r->headers.emplace_back(lower(line.substr(0, colon)), trim(line.substr(colon + 1)));
  return size * n;
}

}  // namespace

bool Response::transport_retryable() const {
  const auto c = static_cast<CURLcode>(curl);
  return c != CURLE_OK && c != CURLE_UNSUPPORTED_PROTOCOL && c != CURLE_URL_MALFORMAT && c != CURLE_NOT_BUILT_IN;
}

std::string Response::transport_error() const {
  return std::string(curl_easy_strerror(static_cast<CURLcode>(curl))) +
         (curl_error.empty() ? "" : " (" + curl_error + ")");
}

std::string Response::header(const std::string& lower_case_name) const {
  for (const auto& [name, value] : headers)
    if (name == lower_case_name) return value;
  return "";
}

Session::Session() {
  if (global_init_result() != CURLE_OK || !(curl_ = curl_easy_init()))
    throw std::runtime_error("libcurl failed to initialize; check the libcurl installation");
}

Session::~Session() { curl_easy_cleanup(static_cast<CURL*>(curl_)); }

Response Session::perform(const Request& request) {
  auto* curl = static_cast<CURL*>(curl_);
  std::unique_ptr<curl_slist, decltype(&curl_slist_free_all)> list(nullptr, &curl_slist_free_all);
  for (const auto& line : request.headers) {
    curl_slist* next = curl_slist_append(list.get(), line.c_str());
    if (!next) throw std::runtime_error("libcurl could not allocate a header list");
    list.release();
    list.reset(next);
  }
  Response r;
  char errbuf[CURL_ERROR_SIZE] = {0};
  curl_easy_setopt(curl, CURLOPT_URL, request.url.c_str());
  curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, request.method.c_str());
  if (request.method == "HEAD") curl_easy_setopt(curl, CURLOPT_NOBODY, 1L);
  if (request.body) {
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, request.body->data());
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(request.body->size()));
  }
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, list.get());
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, &on_body);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &r);
  curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, &on_header);
  curl_easy_setopt(curl, CURLOPT_HEADERDATA, &r);
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, errbuf);
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);  // threads of their own use it (MLflow's sender)
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT, kConnectTimeoutS);
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, kLowSpeedBytesPerS);
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME, kLowSpeedTimeS);
  if (request.timeout_s > 0) {
    curl_easy_setopt(curl, CURLOPT_TIMEOUT, request.timeout_s);
    curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT, std::min(kConnectTimeoutS, request.timeout_s));
  }
  r.curl = curl_easy_perform(curl);
  r.curl_error = errbuf;
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &r.status);
  curl_easy_reset(curl);  // drop the pointers to this frame (errbuf, r, list); keeps the live connection
  return r;
}

std::string uri_encode(const std::string& s, bool keep_slash) {
  static const char* kDigits = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size() * 3);
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || (keep_slash && c == '/')) {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kDigits[c >> 4]);
      out.push_back(kDigits[c & 15]);
    }
  }
  return out;
}

}  // namespace cohort::util::http

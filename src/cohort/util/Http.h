// One HTTP client for the protocols cohort speaks to servers (S3's uploads, MLflow's REST API): a libcurl
// handle reused from request to request, so connections stay open, with the timeouts every caller
// wants. It sends what it is given and reports what came back; each protocol decides which answers
// deserve another try, because only it knows (S3's 200 with an <Error> body, MLflow's error codes).
//
//   cohort::util::http::Session http;
//   const std::string body = R"({"name": "cifar"})";
//   auto r = http.perform({"POST", "http://127.0.0.1:5000/api/2.0/mlflow/experiments/create",
//                          {"Content-Type: application/json"}, &body});
//   if (!r.reached()) std::cerr << r.transport_error();          // no answer at all
//   else if (r.status / 100 != 2) std::cerr << r.status << " " << r.body;
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace cohort::util::http {

struct Request {
  std::string method = "GET";
  std::string url;
  std::vector<std::string> headers;   // "Name: value" lines; "Name:" removes one libcurl would add
  const std::string* body = nullptr;  // PUT and POST: sent as is, not copied (it must outlive perform)
  long timeout_s = 0;                 // the whole exchange (0: none; a stalled transfer still ends, below)
};

struct Response {
  int curl = 0;            // libcurl's CURLcode: 0 when an answer came back
  std::string curl_error;  // libcurl's own detail, when there is one
  long status = 0;         // the HTTP status of the last answer
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // of the last answer; names in lower case

  bool reached() const { return curl == 0; }
  // Whether trying again could help: false for a URL or scheme libcurl cannot use at all.
  bool transport_retryable() const;
  std::string transport_error() const;  // "Couldn't connect to server (Failed to connect to ...)"
  std::string header(const std::string& lower_case_name) const;  // "" when absent
};

class Session {
 public:
  // Throws std::runtime_error when libcurl cannot be initialized.
  Session();
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  Response perform(const Request& request);

 private:
  void* curl_ = nullptr;  // CURL*, kept out of this header so its users need not include curl.h
};

// Percent-encodes everything but RFC 3986's unreserved characters (and '/' when keep_slash).
std::string uri_encode(const std::string& s, bool keep_slash);

}  // namespace cohort::util::http

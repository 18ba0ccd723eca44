#include "cohort/log/Mlflow.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <sstream>

#include "cohort/util/Http.h"

// Note [A tracker never stops a run]
// A tracking server is a convenience beside the run's own files (metrics.jsonl, TensorBoard, summary.json),
// which hold everything it gets. So nothing the server does may cost training time or change the run's
// outcome: the loop only appends to a queue; one thread sends it in MLflow's batches (1,000 entries) and,
// while the server does not answer, keeps up to log.mlflow_buffer records and tries again with a
// growing pause (a warning names the server once per outage). Past the buffer, new records are dropped
// and counted (summary.json's mlflow.dropped). At the end the run waits at most log.mlflow_timeout_s
// for the rest, then uploads the artifacts and sets the status; a failure there is a warning, and the
// exit status stays the run's. MLflow's own clients do the opposite (a failed log_metric raises), which
// suits a notebook, not a job on many machines.

namespace cohort::log {

namespace fs = std::filesystem;

namespace {

constexpr size_t kBatchEntries = 1000;  // MLflow's log-batch limits: 1,000 entries, of which 100 params
constexpr size_t kBatchParams = 100;
constexpr double kMaxBackoffS = 30;

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// A metric value as MLflow's JSON reads it: protobuf's JSON mapping spells non-finite doubles as strings.
nlohmann::json metric_value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  return v;
}

// "mlflow-artifacts:/1/<run>/artifacts" (or with //host:port) -> "1/<run>/artifacts"; "" for any other
// store, which the server does not proxy.
std::string proxied_artifact_path(const std::string& artifact_uri) {
  const std::string scheme = "mlflow-artifacts:";
  if (artifact_uri.compare(0, scheme.size(), scheme) != 0) return "";
  std::string rest = artifact_uri.substr(scheme.size());
  if (rest.compare(0, 2, "//") == 0) {
    const size_t slash = rest.find('/', 2);
    rest = slash == std::string::npos ? "" : rest.substr(slash);
  }
  while (!rest.empty() && rest.front() == '/') rest.erase(0, 1);
  return rest;
}

}  // namespace

struct MlflowRun::Answer {
  bool reached = false;  // an HTTP answer came back
  long status = 0;
  nlohmann::json body;
  std::string error;  // what went wrong, for a message
  bool ok() const { return reached && status / 100 == 2; }
  // Worth another try later: no answer, the server's own failure, or "too many requests".
  bool transient() const { return !reached || status >= 500 || status == 429; }
  std::string code() const { return body.is_object() ? body.value("error_code", "") : ""; }
};

MlflowRun::MlflowRun(MlflowOptions options, Tags tags)
    : options_(std::move(options)), tags_(std::move(tags)), start_ms_(now_ms()) {
  while (!options_.uri.empty() && options_.uri.back() == '/') options_.uri.pop_back();
  sender_ = std::thread([this] { send_loop(); });
}

MlflowRun::~MlflowRun() {
  drain(std::min(options_.timeout_s, 5.0));
  close("FAILED", {});
}

void MlflowRun::params(const Tags& key_values) {
  for (const auto& [k, v] : key_values) push({Record::Kind::kParam, k, v, 0, 0, 0});
}

void MlflowRun::metric(const std::string& key, double value, int64_t step) {
  push({Record::Kind::kMetric, key, "", value, step, now_ms()});
}

nlohmann::json MlflowRun::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {{"uri", options_.uri}, {"experiment_id", experiment_id_}, {"run_id", run_id_}, {"sent", sent_},
          {"dropped", dropped_}, {"artifacts", artifacts_},         {"status", status_}};
}

void MlflowRun::push(Record r) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return;
  // The bound is on metrics: params are the config's keys, a fixed few hundred, and always kept.
  if (r.kind == Record::Kind::kMetric && queued_metrics_ >= options_.buffer) {
    ++dropped_;
    if (!warned_full_)
      std::cerr << "cohort: warning: " << queued_metrics_ << " metrics wait for the MLflow server at " << options_.uri
                << " (log.mlflow_buffer): newer ones are dropped and counted in summary.json (mlflow.dropped)"
                << std::endl;
    warned_full_ = true;
    return;
  }
  if (r.kind == Record::Kind::kMetric) ++queued_metrics_;
  queue_.push_back(std::move(r));
  cv_.notify_one();
}

// The sender: make the run, then send the queue's front in batches, until finish() and an empty queue
// (or its deadline).
void MlflowRun::send_loop() {
  std::unique_ptr<util::http::Session> http;
  try {
    http = std::make_unique<util::http::Session>();
  } catch (const std::exception& e) {
    std::cerr << "cohort: warning: MLflow logging is off: " << e.what() << std::endl;
    return;
  }
  while (wait_for_work()) {
    if (ensure_run(*http)) send_batch(*http);
  }
}

// Waits until there is something to send and the pause after a failure is over; false when the sender
// is done (finish() with nothing left, or its deadline passed).
bool MlflowRun::wait_for_work() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    const auto now = Clock::now();
    if (stopping_ && now >= deadline_) return false;
    const bool work = !queue_.empty() || (stopping_ && run_id_.empty());
    if (stopping_ && !work) return false;
    if (work && now >= next_try_) return true;
    const auto until = work ? std::min(next_try_, deadline_) : deadline_;
    if (until == Clock::time_point::max())
      cv_.wait(lock);
    else
      cv_.wait_until(lock, until);
  }
}

MlflowRun::Answer MlflowRun::call(util::http::Session& http, const std::string& method, const std::string& api,
                                  const nlohmann::json& body) {
  const std::string text = body.is_null() ? "" : body.dump();
  util::http::Request request{method,
                              options_.uri + "/api/2.0/mlflow/" + api,
                              {"Content-Type: application/json"},
                              body.is_null() ? nullptr : &text,
                              static_cast<long>(std::ceil(options_.timeout_s))};
  const util::http::Response r = http.perform(request);
  Answer a;
  a.reached = r.reached();
  a.status = r.status;
  if (!a.reached) {
    a.error = r.transport_error();
    return a;
  }
  a.body = nlohmann::json::parse(r.body, nullptr, /*allow_exceptions=*/false);
  if (!a.ok()) {
    const std::string message = a.body.is_object() ? a.body.value("message", "") : "";
    a.error = "HTTP " + std::to_string(r.status) + " " + a.code() +
              (message.empty() ? r.body.substr(0, 200) : ": " + message);
  }
  return a;
}

void MlflowRun::note_failure(const std::string& what) {
  std::lock_guard<std::mutex> lock(mu_);
  backoff_s_ = backoff_s_ == 0 ? 1 : std::min(backoff_s_ * 2, kMaxBackoffS);
  next_try_ = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(backoff_s_ * 1000));
  if (outage_) return;
  outage_ = true;
  std::cerr << "cohort: warning: the MLflow server at " << options_.uri << " failed: " << what
            << "; training goes on, and up to " << options_.buffer
            << " records (log.mlflow_buffer) wait for it while it is tried again" << std::endl;
}

void MlflowRun::note_success() {
  std::lock_guard<std::mutex> lock(mu_);
  backoff_s_ = 0;
  next_try_ = {};
  if (outage_) std::cerr << "cohort: the MLflow server at " << options_.uri << " answers again" << std::endl;
  outage_ = false;
}

// The experiment (made when missing; another peer may make it first) and this run, once.
bool MlflowRun::ensure_run(util::http::Session& http) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!run_id_.empty()) return true;
  }
  const std::string by_name =
      "experiments/get-by-name?experiment_name=" + util::http::uri_encode(options_.experiment, false);
  Answer a = call(http, "GET", by_name, nullptr);
  if (!a.ok() && a.code() == "RESOURCE_DOES_NOT_EXIST") {
    a = call(http, "POST", "experiments/create", {{"name", options_.experiment}});
    if (!a.ok() && a.code() == "RESOURCE_ALREADY_EXISTS") a = call(http, "GET", by_name, nullptr);
  }
  if (!a.ok()) {
    note_failure("experiment '" + options_.experiment + "': " + a.error);
    return false;
  }
  const std::string experiment_id = a.body.contains("experiment") ? a.body["experiment"].value("experiment_id", "")
                                                                  : a.body.value("experiment_id", "");
  nlohmann::json tags = nlohmann::json::array();
  for (const auto& [k, v] : tags_) tags.push_back({{"key", k}, {"value", v}});
  a = call(
      http, "POST", "runs/create",
      {{"experiment_id", experiment_id}, {"run_name", options_.run_name}, {"start_time", start_ms_}, {"tags", tags}});
  if (!a.ok()) {
    note_failure("creating the run: " + a.error);
    return false;
  }
  const auto& info = a.body["run"]["info"];
  std::lock_guard<std::mutex> lock(mu_);
  run_id_ = info.value("run_id", "");
  experiment_id_ = experiment_id;
  artifact_path_ = proxied_artifact_path(info.value("artifact_uri", ""));
  if (artifact_path_.empty())
    std::cerr << "cohort: warning: the MLflow server at " << options_.uri << " keeps artifacts at '"
              << info.value("artifact_uri", "") << "', which it does not proxy: the run's files stay out of it "
              << "(start `mlflow server` with --serve-artifacts, the default)" << std::endl;
  return true;
}

// One log-batch of the queue's front. A batch the server refuses for what it holds (4xx) is dropped and
// counted, since sending it again cannot help; a failed exchange leaves it for the next try.
void MlflowRun::send_batch(util::http::Session& http) {
  nlohmann::json metrics = nlohmann::json::array(), params = nlohmann::json::array();
  size_t n = 0;
  std::string run_id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    run_id = run_id_;
    for (; n < queue_.size() && n < kBatchEntries; ++n) {
      const Record& r = queue_[n];
      if (r.kind == Record::Kind::kParam) {
        if (params.size() == kBatchParams) break;
        params.push_back({{"key", r.key}, {"value", r.text}});
      } else {
        metrics.push_back(
            {{"key", r.key}, {"value", metric_value(r.value)}, {"timestamp", r.timestamp_ms}, {"step", r.step}});
      }
    }
  }
  if (n == 0) return;
  const Answer a = call(http, "POST", "runs/log-batch", {{"run_id", run_id}, {"metrics", metrics}, {"params", params}});
  if (a.transient()) {
    note_failure("sending " + std::to_string(n) + " records: " + a.error);
    return;
  }
  note_success();
  std::lock_guard<std::mutex> lock(mu_);
  const auto end = queue_.begin() + static_cast<std::ptrdiff_t>(n);
  queued_metrics_ -= static_cast<size_t>(
      std::count_if(queue_.begin(), end, [](const Record& r) { return r.kind == Record::Kind::kMetric; }));
  queue_.erase(queue_.begin(), end);
  if (a.ok()) {
    sent_ += static_cast<int64_t>(n);
  } else {
    dropped_ += static_cast<int64_t>(n);
    std::cerr << "cohort: warning: the MLflow server at " << options_.uri << " refused " << n << " records: " << a.error
              << std::endl;
  }
}

bool MlflowRun::upload(util::http::Session& http, const fs::path& file, const std::string& artifact_path,
                       bool* reached) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return false;
  std::ostringstream bytes;
  bytes << in.rdbuf();
  const std::string body = bytes.str();
  const std::string url = options_.uri + "/api/2.0/mlflow-artifacts/artifacts/" +
                          util::http::uri_encode(artifact_path_ + "/" + artifact_path, /*keep_slash=*/true);
  const auto r = http.perform({"PUT",
                               url,
                               {"Content-Type: application/octet-stream"},
                               &body,
                               static_cast<long>(std::ceil(options_.timeout_s))});
  *reached = r.reached();
  if (r.reached() && r.status / 100 == 2) return true;
  std::cerr << "cohort: warning: the MLflow server at " << options_.uri << " did not take artifact " << artifact_path
            << ": "
            << (r.reached() ? "HTTP " + std::to_string(r.status) + " " + r.body.substr(0, 200) : r.transport_error())
            << std::endl;
  return false;
}

// Lets the sender finish (at most wait_s); what is left then is dropped.
void MlflowRun::drain(double wait_s) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
    deadline_ = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(wait_s * 1000));
    next_try_ = std::min(next_try_, deadline_);
  }
  cv_.notify_all();
  if (sender_.joinable()) sender_.join();
  std::lock_guard<std::mutex> lock(mu_);
  dropped_ += static_cast<int64_t>(queue_.size());
  queue_.clear();
  queued_metrics_ = 0;
  if (run_id_.empty()) status_ = "never made";
}

// From the caller's thread, after drain: the artifacts, then the status.
void MlflowRun::close(const std::string& status, const std::vector<std::pair<fs::path, std::string>>& artifacts) {
  drain();
  std::string run_id, path;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    closed_ = true;
    run_id = run_id_;
    path = artifact_path_;
  }
  if (run_id.empty()) {
    std::cerr << "cohort: warning: the run never reached the MLflow server at " << options_.uri
              << "; its records are in the run directory (metrics.jsonl)" << std::endl;
    return;
  }
  try {
    util::http::Session http;
    int64_t uploaded = 0;
    bool reached = true;  // a server that no longer answers is not asked for the rest
    for (size_t i = 0; !path.empty() && reached && i < artifacts.size(); ++i)
      if (fs::is_regular_file(artifacts[i].first) && upload(http, artifacts[i].first, artifacts[i].second, &reached))
        ++uploaded;
    const Answer a =
        call(http, "POST", "runs/update", {{"run_id", run_id}, {"status", status}, {"end_time", now_ms()}});
    if (!a.ok())
      std::cerr << "cohort: warning: the MLflow server at " << options_.uri << " did not take the run's status "
                << status << ": " << a.error << std::endl;
    std::lock_guard<std::mutex> lock(mu_);
    artifacts_ = uploaded;
    status_ = a.ok() ? status : "unknown (" + status + " not taken)";
  } catch (const std::exception& e) {
    std::cerr << "cohort: warning: the end of the MLflow run failed: " << e.what() << std::endl;
  }
}

}  // namespace cohort::log

// What a run tells an MLflow tracking server (log.mlflow=http://HOST:PORT), over MLflow's REST API: the
// resolved config as params, tags, the scalars TensorBoard gets with their steps, the run's files as
// artifacts through the server's artifact proxy, and the run's status at its end. A thread of its own
// talks to the server, so a slow or dead one never holds up training (Note [A tracker never stops a run]).
//
//   cohort::log::MlflowRun mlflow({"http://127.0.0.1:5000", "cifar10", "resnet18-lr0.4"},
//                                 {{"cohort.strategy", "ddp"}});
//   mlflow.params({{"optim.lr", "0.4"}});
//   mlflow.metric("train/loss", 0.42, /*step=*/100);
//   mlflow.drain();                          // the end: every record sent, or given up on
//   nlohmann::json stats = mlflow.stats();   // run id, records sent and dropped: for summary.json
//   mlflow.close("FINISHED", {{run_dir / "summary.json", "summary.json"}});  // artifacts, then the status
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace cohort::util::http {
class Session;
}

namespace cohort::log {

struct MlflowOptions {
  std::string uri;         // http://HOST:PORT of `mlflow server`
  std::string experiment;  // made when missing
  std::string run_name;
  size_t buffer = 100000;  // metrics kept while the server does not answer; newer ones are dropped
  double timeout_s = 30;   // one request's limit, and the most finish() waits for the server
};

class MlflowRun {
 public:
  using Tags = std::vector<std::pair<std::string, std::string>>;
  // Starts the sender thread; the run is made on the server by that thread (a server down at the start
  // loses nothing: records wait in the buffer).
  MlflowRun(MlflowOptions options, Tags tags);
  // A run never finished (an error unwinds the trainer) ends as FAILED, within a few seconds.
  ~MlflowRun();
  MlflowRun(const MlflowRun&) = delete;
  MlflowRun& operator=(const MlflowRun&) = delete;

  void params(const Tags& key_values);
  void metric(const std::string& key, double value, int64_t step);
  // Lets the sender send what is buffered, waiting at most timeout_s, and stops it; records given later
  // are ignored. Then close uploads the artifacts (file, path among the run's artifacts) and sets the
  // status: FINISHED, FAILED or KILLED. Each acts once; later calls do nothing.
  void drain() { drain(options_.timeout_s); }
  void close(const std::string& status, const std::vector<std::pair<std::filesystem::path, std::string>>& artifacts);
  // {"uri", "run_id", "experiment_id", "sent", "dropped", "artifacts", "status"}: what reached the server.
  nlohmann::json stats() const;

 private:
  struct Record {
    enum class Kind { kParam, kMetric } kind = Kind::kMetric;
    std::string key, text;  // text: a param's value
    double value = 0;       // a metric's
    int64_t step = 0, timestamp_ms = 0;
  };
  struct Answer;  // one REST call's outcome (Mlflow.cpp)
  using Clock = std::chrono::steady_clock;

  void push(Record r);
  void send_loop();
  bool wait_for_work();
  bool ensure_run(util::http::Session& http);
  void send_batch(util::http::Session& http);
  void drain(double wait_s);
  bool upload(util::http::Session& http, const std::filesystem::path& file, const std::string& artifact_path,
              bool* reached);
  Answer call(util::http::Session& http, const std::string& method, const std::string& api, const nlohmann::json& body);
  void note_failure(const std::string& what);
  void note_success();

  MlflowOptions options_;
  Tags tags_;
  int64_t start_ms_ = 0;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Record> queue_;
  size_t queued_metrics_ = 0;
  bool stopping_ = false, closed_ = false;
  Clock::time_point deadline_ = Clock::time_point::max();  // after it the sender gives up (finish)
  Clock::time_point next_try_{};
  double backoff_s_ = 0;
  bool outage_ = false;  // a warning was printed and the server has not answered since
  std::string run_id_, experiment_id_, artifact_path_, status_;
  int64_t sent_ = 0, dropped_ = 0, artifacts_ = 0;
  bool warned_full_ = false;
  std::thread sender_;
};

}  // namespace cohort::log

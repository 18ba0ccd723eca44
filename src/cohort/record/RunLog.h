// What a training run tells the world: metrics.jsonl records, TensorBoard scalars, an MLflow run
// (log.mlflow) and the lines on stdout, all written by rank 0. Every rank holds a RunLog, because a training window's
// metrics and every rank's resource sample are gathered in a collective before rank 0 writes them.
//
//   cohort::record::RunLog log(cfg, run_dir, world_size, /*lead=*/rank == 0, /*plain_lines=*/true);
//   log.started(config_json, "cohort: 2 worker(s), ...", {{"cohort.strategy", "ddp"}});
//   log.train_window(w, window, monitor, comm);     // every rank, at every log interval
//   log.evaluated({step, epoch, r, best, train_seconds});
//   summary["mlflow"] = log.drain_trackers();      // rank 0, at the end
//   log.close_trackers("FINISHED");
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "cohort/comm/Communicator.h"
#include "cohort/config/Config.h"
#include "cohort/log/Mlflow.h"
#include "cohort/log/ResourceMonitor.h"
#include "cohort/log/TensorBoard.h"
#include "cohort/record/Metrics.h"

namespace cohort::record {

// "91.23%", or "n/a" for a negative value (no evaluation yet).
std::string percent(double fraction);

// One training window's figures as the loop knows them (the metrics are reduced inside train_window).
struct TrainWindow {
  int64_t step = 0, epoch = 0, epochs = 1, total_steps = 1;
  double lr = 0, images_per_second = 0, step_loss = 0, train_seconds = 0;
  double grad_norm = -1;  // the last step's norm, when clipping computed it
  int64_t sync_bytes = 0, sync_bytes_uncompressed = 0;
  bool loss_scaling = false;
  double loss_scale = 0;
  int64_t skipped_steps = 0;
  std::vector<std::pair<std::string, double>> strategy_figures;  // Strategy::figures(), by name
  double flops_per_image = -1;  // models/Flops.h, once rank 0 has counted them; -1: not (yet)
  double peak_flops = -1;       // every worker's peak FLOP/s together (log/Peak.h); -1: not known
};

struct EvalWindow {
  int64_t step = 0, epoch = 0;
  MetricSums result;
  double best = -1, train_seconds = 0;
};

// What a tracker's run is tagged with, to find and compare runs by.
struct RunIdentity {
  const TrainConfig& cfg;
  const nlohmann::json& config_json;
  int world_size;
  std::string launcher, strategy, precision;
  std::filesystem::path run_dir;
  bool groups_runs = false;  // a swarm's peers: one tag for the job (StrategyTraits::groups_runs)
};
std::vector<std::pair<std::string, std::string>> tracker_tags(const RunIdentity& run);

class RunLog {
 public:
  using Tags = log::MlflowRun::Tags;
  RunLog(const TrainConfig& cfg, const std::filesystem::path& run_dir, int world_size, bool lead, bool plain_lines);
  ~RunLog();  // an MLflow run not closed ends as FAILED

  // Rank 0: config.json, the line that names the job, and the tracker's run (the config as its params).
  void started(const nlohmann::json& config_json, const std::string& first_line, const Tags& tracker_tags);
  // Collective: every rank calls it at the same step. Reduces the window's metrics and gathers every
  // rank's resource sample (see Note [Resource samples reach rank 0 at log intervals]), writes them
  // (rank 0), and resets the window.
  void train_window(const TrainWindow& w, MetricWindow& window, log::ResourceMonitor& monitor,
                    comm::Communicator& comm);
  void evaluated(const EvalWindow& e);
  void epoch_ended(int64_t epoch, int64_t step, double seconds);
  // Rank 0: any record of its own kind (model_state at the end of a run).
  void record(const nlohmann::json& rec);
  // Rank 0, at the end: waits (at most log.mlflow_timeout_s) for the tracker to take every record and
  // says what it took (null without a tracker); then the run's files and its status.
  nlohmann::json drain_trackers();
  void close_trackers(const std::string& status);

 private:
  void scalar(const std::string& tag, double value, int64_t step);
  void write_resources(int64_t step, double train_seconds, const std::vector<double>& all);

  int world_size_;
  bool lead_, plain_lines_;
  JsonLines metrics_;
  std::unique_ptr<log::EventWriter> tensorboard_;
  log::MlflowOptions mlflow_options_;  // uri empty: no MLflow
  std::unique_ptr<log::MlflowRun> mlflow_;
  std::filesystem::path run_dir_;
};

}  // namespace cohort::record

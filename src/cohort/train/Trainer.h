// The whole training job of one worker process: rendezvous, data, model, strategy, the loop, evaluation,
// checkpoints, metrics and the summary. `cohort train` runs it in every worker; a test can run it too.
//
//   cohort::TrainConfig cfg = cohort::config::load(std::nullopt, {"train.max_steps=20"});
//   const auto info = cohort::comm::world_from_env(cohort::comm::current_env());
//   cohort::train::TrainResult r = cohort::train::run_worker(cfg, info);
//
// run_worker in Trainer.cpp reads as the job, top to bottom: setup, resume, the epochs and their steps,
// evaluation, saves and the summary, each a named call (RunLog, Checkpointer and write_run_summary own
// what they are named for).
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "cohort/comm/WorldInfo.h"
#include "cohort/config/Config.h"

namespace cohort::train {

struct TrainResult {
  std::filesystem::path run_dir;
  int64_t steps = 0;
  double train_seconds = 0;
  double images_per_second = 0;
  double test_accuracy = -1;
  double best_test_accuracy = -1;
  std::vector<double> step_losses;  // this rank's local loss of every step run in this process
  int stop_signal = 0;              // the signal the ranks stopped for (0: none); see util/StopSignal.h
};

TrainResult run_worker(TrainConfig cfg, const comm::WorldInfo& info);

// The intra-op thread count for a worker: train.threads, else OMP_NUM_THREADS, else cores / local workers.
int worker_threads(const TrainConfig& cfg, const comm::WorldInfo& info);

}  // namespace cohort::train

// One worker's training after setup: the state its epochs and steps share, and the steps themselves.
// run_worker (Trainer.cpp) holds one and reads as the whole job; this is what each of its calls does.
//
//   TrainingRun run(cfg, info, world, job, run_dir, resume);
//   for (int64_t epoch = run.first_epoch(); run.more(epoch); ++epoch) {
//     run.train_epoch(epoch);
//     run.evaluate(epoch);
//   }
//   run.save_last();
//   TrainResult result = run.finish();
#pragma once

#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cohort/checkpoint/Names.h"
#include "cohort/comm/WorldInfo.h"
#include "cohort/config/Config.h"
#include "cohort/data/DistributedSampler.h"
#include "cohort/data/Source.h"
#include "cohort/log/Peak.h"
#include "cohort/log/ResourceMonitor.h"
#include "cohort/parallel/Strategy.h"
#include "cohort/record/Metrics.h"
#include "cohort/record/PhaseClock.h"
#include "cohort/record/Progress.h"
#include "cohort/record/RunLog.h"
#include "cohort/record/StepTrace.h"
#include "cohort/train/Checkpointing.h"
#include "cohort/train/Recipe.h"
#include "cohort/train/Setup.h"
#include "cohort/train/StepWatch.h"
#include "cohort/train/Trainer.h"

namespace cohort::train {

class TrainingRun {
 public:
  TrainingRun(const TrainConfig& cfg, const comm::WorldInfo& info, comm::World& world, Job& job,
              const std::filesystem::path& run_dir, const Resume& resume);

  bool more(int64_t epoch) const { return epoch < plan_.epochs() && step_ < plan_.stop_step && !stopped(); }
  // Ctrl-C or SIGTERM ended the run early (Note [Leaving a swarm]).
  bool stopped() const { return stop_signal_ != 0; }
  int64_t first_epoch() const { return step_ / plan_.steps_per_epoch; }
  // The epoch ran to its end, not to train.max_steps.
  bool epoch_complete() const { return step_ % plan_.steps_per_epoch == 0; }
  bool evaluated_last_step() const { return last_eval_step_ == step_; }
  // The epoch the last step belongs to.
  int64_t final_epoch() const { return std::max<int64_t>(0, (step_ - 1) / plan_.steps_per_epoch); }

  void train_epoch(int64_t epoch);
  void evaluate(int64_t epoch);
  void save_last() {
    save_due_ = false;
    save(checkpoint::names::kLast, step_ / plan_.steps_per_epoch);
  }
  // A periodic save (ckpt.every_steps) fell on a step that is evaluated next; see after_step.
  bool save_due() const { return save_due_; }
  TrainResult finish();

 private:
  using Clock = std::chrono::steady_clock;

  std::string first_line(bool resuming) const;
  double train_step();
  bool optimizer_step(double step_loss);
  parallel::StepOptions step_options() const;
  double peak_flops();
  void after_step(int64_t epoch, int64_t step_in_epoch, double step_loss);
  void save(const std::string& tag, int64_t epoch_of_next);
  bool stop_requested();

  const TrainConfig& cfg_;
  const comm::WorldInfo& info_;
  comm::World& world_;
  Job& job_;
  std::filesystem::path run_dir_;
  bool lead_;
  data::DistributedSampler sampler_, test_sampler_;
  // How the strategy shares and paces the data and stops (Note [What the strategy decides for the loop]).
  parallel::StrategyTraits traits_;
  double pending_loss_ = 0;  // losses of the batches accumulated toward the next applied step
  int64_t pending_batches_ = 0;
  Plan plan_;
  Batches batches_;  // each epoch's, or an endless stream's
  nlohmann::json config_json_;
  log::ResourceMonitor monitor_;
  record::Progress progress_;
  record::RunLog log_;
  Checkpointer checkpoints_;
  Recipe recipe_;  // the model's recipe around the step: airbench's whitening freeze and lookahead
  int stop_signal_ = 0;
  record::PhaseClock clock_;  // where the time goes, phase by phase (record/PhaseClock.h)
  record::StepTrace trace_;   // log.trace_steps (record/StepTrace.h)
  record::MetricWindow window_;
  StepWatch watch_;  // what watches the step: Note [The step and what watches it] in StepWatch.h
  bool save_due_ = false;

  int64_t step_ = 0, first_step_ = 0, last_eval_step_ = -1;
  double best_ = -1, test_accuracy_ = -1;
  double train_seconds_ = 0, grad_norm_ = -1;  // grad_norm_: the last step's, when clipping computes it
  int64_t images_seen_ = 0, window_images_ = 0;
  double flops_per_image_ = -1;
  // One worker's peak (log/Peak.h), resolved by rank 0 once it has counted the FLOPs; the summary's too.
  bool peak_resolved_ = false;
  std::optional<log::Peak> peak_;
  std::string peak_why_;  // why there is none (a GPU the table does not hold)
  Clock::time_point window_start_ = Clock::now(), session_start_ = Clock::now();
  std::vector<double> step_losses_;
};

}  // namespace cohort::train

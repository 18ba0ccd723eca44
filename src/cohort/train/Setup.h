// What a worker sets up before it trains or evaluates, shared by run_worker and run_eval_worker: the
// threads and the rendezvous, the checkpoint a run resumes from, the model on its device in its precision
// wrapped by its strategy with its data, and the run's shape (batches, steps, schedule).
//
//   World world = cohort::train::join_world(cfg, info);
//   const auto resume = cohort::train::find_resume(cfg, info, world);
//   auto job = cohort::train::set_up_job(cfg, info, world, resume);
//   const auto plan = cohort::train::make_plan(cfg, sampler, info);
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>

#include "cohort/amp/MixedPrecision.h"
#include "cohort/checkpoint/Checkpoint.h"
#include "cohort/comm/Rendezvous.h"
#include "cohort/config/Config.h"
#include "cohort/data/Datasets.h"
#include "cohort/data/DistributedSampler.h"
#include "cohort/models/Models.h"
#include "cohort/optim/Ema.h"
#include "cohort/optim/Schedule.h"
#include "cohort/train/AutoSettings.h"
#include "cohort/train/Evaluate.h"
#include "cohort/train/StrategyFactory.h"

namespace cohort::train {

// Threads and the rendezvous: what training and evaluation both start with. Threads first: N workers on
// one machine must not each start a thread per core (torchrun sets OMP_NUM_THREADS=1 for the same reason).
comm::World join_world(const TrainConfig& cfg, const comm::WorldInfo& info);

// In-memory datasets build a batch in well under a millisecond: a prefetch thread would only compete
// with the step for the cores. Decoded datasets run ahead.
int64_t prefetch_batches(const TrainConfig& cfg);

// The checkpoint a run continues from (none: `from` is empty).
struct Resume {
  checkpoint::Checkpoint checkpoint;
  std::filesystem::path from;  // the save's directory
  bool active() const { return !from.empty(); }
};

// A restarted attempt (--max-restarts) resumes from the run's last checkpoint, if the failed attempt got
// as far as saving one; then train.resume names the save rank 0 picked, which every rank loads.
// Sampling and augmentation are pure functions of (seed, epoch, index), so they need no saved state.
Resume find_resume(TrainConfig& cfg, const comm::WorldInfo& info, comm::World& world);

// The run directory a launcher's restart must find again when run.dir is not set: under torchrun,
// runs/torchrun-<TORCHELASTIC_RUN_ID>; under Slurm, runs/slurm-<SLURM_JOB_ID> (a requeued job keeps its
// id). Empty where there is none to derive: another launcher, or torchrun's default id "none", which
// every job started without --rdzv-id shares.
std::string launcher_run_dir(const comm::WorldInfo& info);

// The model on its device, in its precision, wrapped by its strategy, with the data it trains on.
struct Job {
  c10::Device device{c10::kCPU};
  AutoSettings chosen;
  bool nhwc = false;
  data::Splits data;
  std::shared_ptr<models::Classifier> model;
  std::unique_ptr<amp::MixedPrecision> precision;
  std::unique_ptr<parallel::Strategy> strategy;
  std::unique_ptr<optim::Ema> lookahead;  // airbench's moving average of the weights, when train.lookahead
  EvalPlacement placement() const { return {device, nhwc, precision.get()}; }
};

// cfg's "auto" settings are resolved here, the same on every rank (Note [What auto picks]).
Job set_up_job(TrainConfig& cfg, const comm::WorldInfo& info, comm::World& world, const Resume& resume);

// The run's shape: batches, steps and the learning-rate schedule.
struct Plan {
  int64_t batch, accum, steps_per_epoch, total_steps, stop_step, global_batch;
  optim::Schedule schedule;
  // The passes the run's steps start: train.epochs rounded up (a fractional last pass is one).
  int64_t epochs() const { return (total_steps + steps_per_epoch - 1) / steps_per_epoch; }
};

Plan make_plan(const TrainConfig& cfg, const data::DistributedSampler& sampler, const comm::WorldInfo& info);

// The sampler of the training set: this rank's share as its strategy deals it (Note [What the strategy
// decides for the loop] in parallel/Strategy.h).
data::DistributedSampler training_sampler(const TrainConfig& cfg, int64_t dataset_size, const comm::WorldInfo& info);

// The batches this rank trains on, as its strategy paces them (StrategyTraits::endless_step_samples): each
// epoch's share of the sampler's order from where a resumed run left off, or for an endless stream (the
// swarm) pass after pass over the whole set, whatever the epochs. The loop asks for the next batch, never
// which of the two it has.
//
//   Batches batches(cfg, *job.data.train, sampler, plan, traits.endless_step_samples > 0, /*pin=*/false);
//   batches.start_epoch(epoch, first_step, steps);   // an endless stream ignores it
//   data::Batch b = batches.next();
//   batches.end_epoch();
class Batches {
 public:
  Batches(const TrainConfig& cfg, data::Source& train, const data::DistributedSampler& sampler, const Plan& plan,
          bool endless, bool pin);
  // The epoch's steps first_step .. first_step + steps - 1 (counted within the epoch).
  void start_epoch(int64_t epoch, int64_t first_step, int64_t steps);
  void end_epoch() { epoch_.reset(); }
  data::Batch next();

 private:
  data::AugmentOptions augment(int64_t pass) const;

  const TrainConfig& cfg_;
  data::Source& train_;
  const data::DistributedSampler& sampler_;
  const Plan& plan_;
  bool endless_, pin_;
  std::optional<data::Loader> epoch_;
  std::unique_ptr<data::Loader> stream_;
  int64_t stream_pass_ = 0;
};

}  // namespace cohort::train

// Save and resume for the trainer, in one place: what each save holds (the model or this rank's shards,
// the optimizer, the strategy's and the lookahead's state, the loss scaler, the step), where it goes
// ("last" into a fresh step directory that is committed and pruned, checkpoint/Steps.h; "best" replaced
// in place), when a save is skipped, and, on resume, handing each owner its state back.
//
//   cohort::train::Checkpointer checkpoints(cfg, run_dir, world, {*model, *strategy, precision, lookahead},
//                                           config_json);
//   if (resuming) checkpoints.restore(resume);
//   checkpoints.save("last", {step, epoch_of_next, best});   // collective: every rank calls it
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "cohort/amp/MixedPrecision.h"
#include "cohort/checkpoint/Checkpoint.h"
#include "cohort/comm/Rendezvous.h"
#include "cohort/config/Config.h"
#include "cohort/optim/Ema.h"
#include "cohort/parallel/Strategy.h"

namespace cohort::train {

// What a save records of where training stands.
struct SavePoint {
  int64_t step = 0;
  int64_t epoch_of_next = 0;  // the epoch the next step belongs to
  double best = -1;           // the best test accuracy so far (-1: none)
};

class Checkpointer {
 public:
  // The owners of what a checkpoint holds; `lookahead` may be null.
  struct Owners {
    torch::nn::Module& model;
    parallel::Strategy& strategy;
    amp::MixedPrecision& precision;
    optim::Ema* lookahead;
  };
  Checkpointer(const TrainConfig& cfg, const std::filesystem::path& run_dir, comm::World& world, Owners owners,
               std::string config_json);

  // tag "last" or "best". Collective: a sharded save is written by every rank, and a compression hook
  // gathers every rank's residuals. A "last" of the state the previous "last" already holds is skipped.
  void save(const std::string& tag, const SavePoint& at);
  // A resumed run's optimizer, strategy, lookahead and loss-scaler state, back to their owners.
  void restore(const checkpoint::Checkpoint& resume);

 private:
  checkpoint::TrainState train_state(const SavePoint& at) const;
  std::filesystem::path directory_for(const std::string& tag, int64_t step, bool sharded);

  const TrainConfig& cfg_;
  std::filesystem::path ck_dir_;
  comm::World& world_;
  Owners owners_;
  std::string config_json_;
  bool lead_;
  int64_t last_saved_step_ = -1, sharded_saves_ = 0;
  double last_saved_best_ = -2;
};

}  // namespace cohort::train

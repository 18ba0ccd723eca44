// The optimizer of a sharded strategy, over this rank's slices only (ZeRO's partitioned optimizer state):
// one tensor per piece of a parameter this rank owns, a view into the unit's float32 master, named after
// the parameter, so the update is exactly ddp's per-element arithmetic and the state is keyed as ddp's
// is. Also what a checkpoint needs of it: the slices by unit, and loading from full per-parameter state.
//
//   cohort::parallel::shard::OptimizerSlices slices(cfg.optim, plan, units, trainable, rank);
//   slices.step(lr, float32_grad_shards);
//   slices.fill_save(save);                     // params, state kinds and step for checkpoint::save_sharded
//   if (slices.load(full_state)) units.regather_persistent();
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "cohort/checkpoint/ShardedCheckpoint.h"
#include "cohort/config/Config.h"
#include "cohort/optim/Optimizer.h"
#include "cohort/parallel/shard/FlatUnits.h"
#include "cohort/util/OldNames.h"  // the names of the last release, for programs outside this tree

namespace cohort::parallel::shard {

class OptimizerSlices {
 public:
  OptimizerSlices(const OptimConfig& cfg, const ShardPlan& plan, FlatUnits& units, const Trainable& trainable,
                  int rank);

  // Updates the masters from `grads` (one float32 gradient slice per unit, already unscaled and clipped).
  void step(double lr, const std::vector<at::Tensor>& grads);
  // step() one unit at a time (optim.in_backward): begin_step() once per step, then update() for each
  // unit, at most once per step, with its float32 gradient slice. Each slice gets step()'s update.
  void begin_step() { optimizer_->begin_step(); }
  void update(double lr, size_t unit, const at::Tensor& grad);
  void freeze(const std::string& name) { optimizer_->freeze(name); }
  void set_momentum(double momentum) { optimizer_->set_momentum(momentum); }
  int64_t state_bytes() const { return optimizer_->state_bytes(); }

  // This rank's masters and optimizer state by unit, and the layout's optimizer fields.
  void fill_save(checkpoint::ShardedSave& save) const;
  // Takes this rank's pieces of full per-parameter state ("<kind>.<name>", "step", and "master.<name>":
  // fp16-master's float32 weights). Returns whether masters were loaded, the same answer on every rank
  // (from the names saved), so the caller gathers the units again collectively.
  bool load(const optim::NamedState& full);

 private:
  struct Slot {
    size_t unit;
    Range range;
    at::Tensor piece;  // the optimizer's tensor: a view into the unit's master
  };
  at::Tensor piece_of(const std::map<std::string, at::Tensor>& full, const std::string& key, const Slot& s) const;

  const ShardPlan& plan_;
  FlatUnits& units_;
  std::vector<std::string> names_;
  std::vector<Slot> slots_;
  std::vector<std::vector<std::vector<size_t>>> members_;  // [unit][group] -> indices of its pieces there
  std::unique_ptr<optim::Optimizer> optimizer_;
};

}  // namespace cohort::parallel::shard

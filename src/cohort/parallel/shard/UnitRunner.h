// When zero2's and fsdp's units are gathered, freed and reduced around forward and backward: the unit
// runner of both (FSDP2's pre/post-forward and pre/post-backward hooks, in one class). Its state is one
// explicit value rather than flags: kIdle between passes, kBackwardSynced or kBackwardLocal from the
// first gradient of a backward until autograd's end-of-backward callback, which finishes the reductions.
// Under optim.in_backward (zero1 too) it hands each unit whose reduce-scatter has ended to the strategy,
// which steps that unit's slice while backward goes on (Note [Sharded steps inside backward]).
// Under fsdp it is also the model's models::UnitRunner: the root unit is gathered when the forward
// starts and stays gathered until its gradients are reduced (as FSDP2 keeps its root); each block is
// gathered around its forward (the next block's gather prefetched) and again for its backward.
//
//   cohort::parallel::shard::UnitRunner runner(plan, units, blocks, trainable, bytes, trace, /*frees_units=*/true);
//   classifier->set_unit_runner(&runner);       // fsdp only
//   runner.set_sync(false);  loss.backward();   // a gradient-accumulation pass: no reduce
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "cohort/models/Models.h"
#include "cohort/parallel/shard/FlatUnits.h"
#include "cohort/util/OldNames.h"  // the names of the last release, for programs outside this tree

namespace cohort::parallel::shard {

class UnitRunner : public models::UnitRunner {
 public:
  enum class Pass { kIdle, kBackwardSynced, kBackwardLocal };

  // blocks[b]: the units gathered before block b runs (b = 0: the root). Attaches the gradient hooks.
  UnitRunner(const ShardPlan& plan, FlatUnits& units, std::vector<std::vector<size_t>> blocks,
             const Trainable& trainable, SyncBytes& bytes, UnitTrace& trace);

  // Whether the next backward reduces its gradients (gradient accumulation turns it off).
  void set_sync(bool enabled) { sync_ = enabled; }
  bool sync() const { return sync_; }
  Pass pass() const { return pass_; }

  // Called with each unit whose gradients are averaged into its grad_shard, in the order the units were
  // reduced: during backward once its reduce-scatter is over, else at backward's end. Only after a
  // synchronized backward.
  void set_on_unit_reduced(std::function<void(size_t)> on_reduced) { on_unit_reduced_ = std::move(on_reduced); }
  // Whether a unit reduced after unit u in this backward, or one not yet reduced, is still in flight.
  bool reducing_after(size_t u) const;
  // How many units of the last synchronized backward were handed over before its end.
  size_t finished_in_backward() const { return finished_in_backward_; }

  // models::UnitRunner (fsdp).
  at::Tensor run_model(const std::function<at::Tensor()>& forward) override;
  at::Tensor run(size_t index, const std::function<at::Tensor()>& forward) override;

 private:
  void begin_backward();
  void pre_backward(size_t block);
  void on_gradient_ready(size_t param);
  void unit_backward_done(size_t u);
  void finish_backward();
  void finish_completed_units();
  void finish_unit(size_t u);
  void gather_block(size_t b);
  void prefetch_block(size_t b);
  void free_block(size_t b);

  const ShardPlan& plan_;
  FlatUnits& units_;
  std::vector<std::vector<size_t>> blocks_;
  std::vector<at::Tensor> params_;
  SyncBytes& bytes_;
  UnitTrace& trace_;
  bool sync_ = true;
  Pass pass_ = Pass::kIdle;
  std::vector<size_t> pending_;  // per unit: gradients still to come in this backward
  std::vector<bool> reduced_;    // per unit: done in this backward
  std::vector<size_t> order_;    // units reduced in this backward, in order
  size_t next_to_finish_ = 0;    // order_[next_to_finish_] is the next to hand to on_unit_reduced_
  size_t finished_in_backward_ = 0;
  std::function<void(size_t)> on_unit_reduced_;
  std::shared_ptr<std::function<void(size_t)>> fire_;
  std::vector<std::shared_ptr<void>> grad_accumulators_;
};

}  // namespace cohort::parallel::shard

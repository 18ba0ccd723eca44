// The flat units every sharded strategy is made of (FSDP2's FSDPParamGroup, without the policy): each
// unit's parameters are views into one flat buffer; this rank keeps a float32 master of its slice and the
// slice of the averaged gradient; and a unit moves between three states by collectives: kSharded (the full
// buffer's memory freed), kGathering (an all-gather of every rank's slice in flight), kGathered. Gradients
// go the other way by reduce-scatter. Which units stay gathered, and when they are gathered, freed and
// reduced, is the strategy's policy (ShardedStrategy.cpp), not this file's.
//
//   cohort::parallel::shard::FlatUnits units(plan, trainable, comm, {.persistent = false}, "fsdp", &trace);
//   units.start_gather(2);  units.ensure_gathered(2);  ...forward...  units.free(2);
//   units.launch_reduce(2, flat_grad, bytes);  units.wait_reduces();
#pragma once

#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "cohort/comm/Communicator.h"
#include "cohort/parallel/Params.h"
#include "cohort/parallel/Strategy.h"
#include "cohort/parallel/shard/ShardPlan.h"
#include "cohort/util/OldNames.h"  // the names of the last release, for programs outside this tree

namespace cohort::parallel::shard {

enum class UnitState { kSharded, kGathering, kGathered };

struct FlatUnit {
  at::Tensor full;         // the unit's flat parameters; params are views into it
  size_t nbytes = 0;       // full's storage size when allocated
  at::Tensor master;       // this rank's float32 slice, which the optimizer updates
  at::Tensor gather_src;   // 16-bit units: the master rounded to the weights' dtype, while its gather runs
  at::Tensor grad_shard;   // this rank's slice of the averaged gradient
  at::Tensor flat_grad;    // zero1: the full gradients, which params' .grad are views of
  bool persistent = true;  // stays gathered between steps
  UnitState state = UnitState::kGathered;
  comm::HandlePtr gather, reduce;
  at::Tensor reduce_src;  // the reduce-scatter's input, kept alive until it finishes
  bool sixteen_bit() const { return full.scalar_type() != at::kFloat; }
};

// What tests read to see that a gather was launched ahead of its use: "gather 2", "wait 2", "forward 2",
// "free 2", "backward 2", "reduce 2", in order, while on.
struct UnitTrace {
  bool on = false;
  std::vector<std::string> events;
  void note(const char* what, size_t u) {
    if (on) events.push_back(std::string(what) + " " + std::to_string(u));
  }
};

struct UnitOptions {
  bool persistent = true;       // every unit stays gathered (zero1, zero2); else only gathered around use (fsdp)
  bool full_gradients = false;  // zero1: .grad are views of one flat gradient per unit, reduced at the step
                                // (during backward under optim.in_backward)
};

class FlatUnits {
 public:
  // Flattens the trainable parameters into the plan's units (each parameter becomes a view into its
  // unit), keeps this rank's slices and frees the units that are not persistent.
  FlatUnits(const ShardPlan& plan, const Trainable& trainable, comm::Communicator& comm, UnitOptions options,
            std::string who, UnitTrace* trace);

  size_t size() const { return units_.size(); }
  FlatUnit& operator[](size_t u) { return units_[u]; }
  const FlatUnit& operator[](size_t u) const { return units_[u]; }

  void start_gather(size_t u);     // kSharded -> kGathering (or kGathered at once on one rank)
  void ensure_gathered(size_t u);  // -> kGathered, waiting for a gather in flight
  void free(size_t u);             // -> kSharded (Note [Freeing a unit's parameters])
  // Updated slices go back to every rank for the persistent units; the others gather when next used.
  void regather_persistent();

  // Averages `flat` (the unit's full gradient) across ranks into the unit's grad_shard: divided by the
  // world size first, then reduce-scattered. Adds what it sends to `bytes`.
  void launch_reduce(size_t u, at::Tensor flat, SyncBytes& bytes);
  // Whether unit u's reduce-scatter is over (or none is in flight); never blocks.
  bool reduce_done(size_t u) const;
  void wait_reduce(size_t u);
  void wait_reduces();
  void zero_grads();

  int64_t gathered_bytes() const;
  // Parameters (full buffers and masters), gradients (slices or zero1's full ones) and 16-bit units' masters.
  StateBytes state_bytes() const;

 private:
  FlatUnit build_unit(const Unit& unit, const Trainable& trainable);

  comm::Communicator& comm_;
  UnitOptions options_;
  std::string who_;
  UnitTrace* trace_;
  int rank_, world_;
  std::vector<FlatUnit> units_;
};

}  // namespace cohort::parallel::shard

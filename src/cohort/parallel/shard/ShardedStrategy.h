// ZeRO-1, ZeRO-2 and FSDP (ZeRO-3) behind cohort::parallel::Strategy: three small policies (ShardedStrategy.cpp)
// over the same parts, as FSDP2 splits them: flat units with gather and free (FlatUnits.h), the
// optimizer's slices (OptimizerSlices.h) and the unit runner (UnitRunner.h). Parameters are flattened
// into units (see ShardPlan, Units.h); each rank keeps a float32 master copy of its slice of every unit
// and the optimizer state for that slice only. Under amp.precision=fp16-master the units hold fp16 weights and
// gradients (batch norm's stay float32, in units of their own) and only the slices' masters are float32: ZeRO's mixed-
// precision layout (Note [Sharding 16-bit weights]).
//   zero1  full gradients as DDP has them; at the step each unit is reduce-scattered, the slice updated,
//          and the parameters all-gathered.
//   zero2  each unit's gradients are reduce-scattered during backward as soon as the unit's last
//          gradient is ready (overlapping the rest of backward) and then dropped: only the slice stays.
//   fsdp   as zero2, and a unit's full parameters exist only while it runs: gathered before its forward
//          (the next unit's gather prefetched), freed after it, gathered again for its backward.
// With optim.in_backward each unit's slice is stepped as soon as its reduce-scatter ends (zero1's too,
// reduced during backward then), and the step only gathers the updated parameters.
//
//   namespace shard = cohort::parallel::shard;
//   auto strategy = shard::make_sharded_strategy(model, comm, {.stage = shard::ShardStage::kFsdp});
//   strategy->build_optimizer(cfg.optim);
//   loss.backward();  strategy->step(lr, /*clip_norm=*/1.0);
#pragma once

#include <memory>
#include <string>

#include <torch/nn/module.h>

#include "cohort/comm/Communicator.h"
#include "cohort/parallel/Strategy.h"
#include "cohort/parallel/shard/ShardPlan.h"
#include "cohort/util/OldNames.h"  // the names of the last release, for programs outside this tree

namespace cohort::parallel::shard {

enum class ShardStage { kZero1, kZero2, kFsdp };

struct ShardedOptions {
  ShardStage stage = ShardStage::kZero2;
  double bucket_mb = 25.0;          // zero1/zero2: unit size
  std::string fsdp_unit = "block";  // fsdp: models::Classifier::units policy
  bool broadcast_buffers = true;    // batch-norm statistics follow rank 0 at every step, as with ddp
  // optim.in_backward: each unit's slice is stepped as its reduce-scatter ends, while backward goes on;
  // zero1 then reduces during backward too (Note [Sharded steps inside backward]).
  bool in_backward = false;
};

// The sharded strategy's own view, for tests and benchmarks.
class ShardedStrategy : public Strategy {
 public:
  virtual const parallel::shard::ShardPlan& plan() const = 0;
  // Whether unit `u`'s full parameters are allocated now (fsdp frees them outside forward/backward).
  virtual bool unit_gathered(size_t u) const = 0;
  // Bytes of full-parameter storage allocated now, over all units.
  virtual int64_t gathered_bytes() const = 0;
  // When on, records what happens to units, in order ("gather 2", "wait 2", "forward 2", "free 2",
  // "backward 2", "reduce 2"), so tests can see that a gather was launched ahead of its use.
  virtual void set_tracing(bool on) = 0;
  virtual std::vector<std::string> trace() const = 0;
  // Copies of every full parameter, by name (fsdp gathers each unit for it and frees it again).
  // Collective.
  virtual std::vector<std::pair<std::string, at::Tensor>> full_parameters() = 0;
};

// The plan the strategy would build for `model` at `world` ranks, without any communication (for
// benchmarks that count bytes at world sizes this machine cannot run). Sets a Classifier's unit policy.
parallel::shard::ShardPlan plan_shards(torch::nn::Module& model, const ShardedOptions& options, int world);

// fsdp needs a models::Classifier (for its units); zero1 and zero2 take any module.
std::unique_ptr<ShardedStrategy> make_sharded_strategy(std::shared_ptr<torch::nn::Module> model,
                                                       comm::CommunicatorPtr comm, const ShardedOptions& options);

}  // namespace cohort::parallel::shard

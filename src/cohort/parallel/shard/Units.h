// How the sharded strategies cut a model into units, before any tensor is flattened: ZeRO's units are
// gradient buckets, FSDP's are the model's blocks. A unit is one flat buffer, so it holds one dtype;
// under amp.precision=fp16-master a block's fp16 weights and its fp32 batch norm become two units of
// the same block (FSDP gathers both before the block runs, and frees each once its gradients are
// reduced). Internal to parallel/shard.
//
//   auto layout = cohort::parallel::shard::plan_units(model, specs, options);
//   cohort::parallel::shard::ShardPlan plan(specs, layout.units, world);
//   layout.blocks[b];   // the units FSDP gathers before block b runs (b = 0: the root)
#pragma once

#include <string>
#include <vector>

#include <torch/nn/module.h>

#include "cohort/parallel/shard/ShardPlan.h"
#include "cohort/parallel/shard/ShardedStrategy.h"
#include "cohort/util/OldNames.h"  // the names of the last release, for programs outside this tree

namespace cohort::parallel::shard {

struct UnitLayout {
  std::vector<std::vector<size_t>> units;   // parameter indices per unit (ShardPlan's input)
  std::vector<std::vector<size_t>> blocks;  // fsdp: unit indices per block, the root first; else one per unit
};

// Sets a Classifier's unit policy under fsdp. ZeRO's units are the bucketer's (BucketPlan.h, sized by
// dist.bucket_mb in bytes, one dtype each); FSDP's are the model's blocks. A block with no parameters still
// gets one (empty) unit, so block and unit numbers agree for single-dtype models.
UnitLayout plan_units(torch::nn::Module& model, const std::vector<ParamSpec>& specs, const ShardedOptions& options);

}  // namespace cohort::parallel::shard

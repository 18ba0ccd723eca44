// How the sharded strategies cut a model into units, before any tensor is flattened: ZeRO's units are
// gradient buckets, FSDP's are the model's blocks. A unit is one flat buffer, so it holds one dtype;
// under amp.precision=fp16-master a block's fp16 weights and its fp32 batch norm become two units of
// the same block (FSDP gathers both before the block runs, and frees each once its gradients are
// reduced). Internal to parallel/shard.
//
//   auto layout = cohort::shard::plan_units(model, specs, dtypes, options);
//   cohort::shard::ShardPlan plan(specs, layout.units, world);
//   layout.blocks[b];   // the units FSDP gathers before block b runs (b = 0: the root)
#pragma once

#include <string>
#include <vector>

#include <c10/core/ScalarType.h>
#include <torch/nn/module.h>

#include "cohort/comm/Communicator.h"
#include "cohort/parallel/shard/ShardPlan.h"
#include "cohort/parallel/shard/Sharded.h"

namespace cohort::shard {

struct UnitLayout {
  std::vector<std::vector<size_t>> units;   // parameter indices per unit (ShardPlan's input)
  std::vector<std::vector<size_t>> blocks;  // fsdp: unit indices per block, the root first; else one per unit
};

// The trainable parameters' names and shapes, and their dtypes, in the model's order.
std::vector<ParamSpec> trainable_specs(torch::nn::Module& model);
std::vector<c10::ScalarType> trainable_dtypes(torch::nn::Module& model);

// Sets a Classifier's unit policy under fsdp. A block with no parameters still gets one (empty) unit,
// so block and unit numbers agree for single-dtype models.
UnitLayout plan_units(torch::nn::Module& model, const std::vector<ParamSpec>& specs,
                      const std::vector<c10::ScalarType>& dtypes, const ShardedOptions& options);

// Every rank must have built the same parameters (names, shapes, dtypes), or the flat layouts differ and
// the collectives would mix unrelated numbers: a hash of them is compared with rank 0's, and a
// difference is a CommError naming the rank. Collective.
void check_replicas_match(const std::vector<std::string>& names, const std::vector<at::Tensor>& params,
                          Communicator& comm, const std::string& who);

// Makes `tensors` equal to rank 0's, one flat broadcast per dtype.
void broadcast_from_rank0(const std::vector<at::Tensor>& tensors, Communicator& comm, const std::string& what);

}  // namespace cohort::shard

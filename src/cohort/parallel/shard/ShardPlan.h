// How ZeRO and FSDP split a model's parameters across ranks. Parameters are grouped into units (a
// gradient bucket for ZeRO, a residual or transformer block for FSDP); each unit is flattened into one
// buffer, padded so its length divides by the world size, and rank r owns the r-th equal slice of
// every unit. Pure arithmetic, no tensors, so it is tested on its own.
//
//   cohort::parallel::shard::ShardPlan plan({{"fc.weight", {10, 5}}, {"fc.bias", {10}}}, {{0, 1}}, /*world=*/4);
//   plan.unit(0).padded;          // 60 -> 60 (already divisible); shard() == 15
//   for (auto r : plan.ranges(0, /*rank=*/1)) ...   // fc.weight elements 15..29 at shard offset 0
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cohort/parallel/Params.h"
#include "cohort/util/OldNames.h"  // the names of the last release, for programs outside this tree

namespace cohort::parallel::shard {

using cohort::parallel::ParamSpec;  // parallel/Params.h: one parameter description for every plan

struct Unit {
  std::vector<size_t> params;    // indices into the plan's parameters, in flat order
  std::vector<int64_t> offsets;  // each parameter's offset in the unit's flat buffer
  int64_t numel = 0;             // sum of the parameters' sizes
  int64_t padded = 0;            // numel rounded up to a multiple of the world size
  int64_t shard = 0;             // padded / world: what each rank owns
};

// One piece of a parameter that a rank owns: elements [param_offset, param_offset + length) of the
// flattened parameter sit at [shard_offset, shard_offset + length) of the rank's shard of the unit.
struct Range {
  size_t param = 0;
  int64_t param_offset = 0;
  int64_t shard_offset = 0;
  int64_t length = 0;
};

class ShardPlan {
 public:
  ShardPlan() = default;
  // Every parameter must be in exactly one unit; throws cohort::Error otherwise.
  ShardPlan(std::vector<ParamSpec> params, std::vector<std::vector<size_t>> units, int world);

  int world() const { return world_; }
  const std::vector<ParamSpec>& params() const { return params_; }
  const std::vector<Unit>& units() const { return units_; }
  const Unit& unit(size_t u) const { return units_.at(u); }
  // The unit a parameter belongs to.
  size_t unit_of(size_t param) const { return unit_of_.at(param); }
  // The pieces of parameters inside rank `rank`'s slice of unit `u`, in shard order; padding owns none.
  std::vector<Range> ranges(size_t u, int rank) const;
  // Elements a rank holds over all units (with padding), and the model's own parameter count.
  int64_t shard_numel() const;
  int64_t total_numel() const;

 private:
  std::vector<ParamSpec> params_;
  std::vector<Unit> units_;
  std::vector<size_t> unit_of_;
  int world_ = 1;
};

}  // namespace cohort::parallel::shard

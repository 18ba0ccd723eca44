#include "cohort/parallel/shard/Units.h"

#include <algorithm>

#include "cohort/models/Models.h"
#include "cohort/parallel/BucketPlan.h"
#include "cohort/util/Error.h"

namespace cohort::parallel::shard {
namespace {

// Splits `indices` by dtype, keeping the order of first appearance and the order within each dtype.
std::vector<std::vector<size_t>> by_dtype(const std::vector<size_t>& indices, const std::vector<ParamSpec>& specs) {
  std::vector<c10::ScalarType> seen;
  std::vector<std::vector<size_t>> out;
  for (size_t i : indices) {
    size_t k = 0;
    while (k < seen.size() && seen[k] != specs[i].dtype) ++k;
    if (k == seen.size()) {
      seen.push_back(specs[i].dtype);
      out.emplace_back();
    }
    out[k].push_back(i);
  }
  return out;
}

}  // namespace

UnitLayout plan_units(torch::nn::Module& model, const std::vector<ParamSpec>& specs, const ShardedOptions& options) {
  UnitLayout layout;
  if (options.stage != ShardStage::kFsdp) {
    // dist.bucket_mb is bytes: a unit of fp16 parameters holds twice the elements of a float32 one.
    const auto cap = std::max<int64_t>(1, static_cast<int64_t>(options.bucket_mb * (1 << 20)));
    for (auto& bucket : plan_buckets(specs, cap, cap)) {
      layout.blocks.push_back({layout.units.size()});
      layout.units.push_back(std::move(bucket.params));
    }
    return layout;
  }
  // FSDP: block 0 is the root (every parameter under no block's prefix), then the model's blocks.
  auto* classifier = dynamic_cast<models::Classifier*>(&model);
  const auto prefixes = classifier ? classifier->units(options.fsdp_unit) : std::vector<std::string>{};
  std::vector<std::vector<size_t>> members(prefixes.size() + 1);
  for (size_t i = 0; i < specs.size(); ++i) {
    size_t b = 0;
    for (size_t k = 0; k < prefixes.size(); ++k)
      if (specs[i].name.rfind(prefixes[k], 0) == 0) {
        b = k + 1;
        break;
      }
    members[b].push_back(i);
  }
  for (const auto& block : members) {
    layout.blocks.emplace_back();
    auto groups = by_dtype(block, specs);
    if (groups.empty()) groups.emplace_back();
    for (auto& g : groups) {
      layout.blocks.back().push_back(layout.units.size());
      layout.units.push_back(std::move(g));
    }
  }
  return layout;
}

}  // namespace cohort::parallel::shard

#include "cohort/parallel/shard/Units.h"

#include <map>

#include "cohort/models/Models.h"
#include "cohort/util/Error.h"

namespace cohort::shard {
namespace {

// Splits `indices` by dtype, keeping the order of first appearance and the order within each dtype.
std::vector<std::vector<size_t>> by_dtype(const std::vector<size_t>& indices, const std::vector<c10::ScalarType>& dtypes) {
  std::vector<c10::ScalarType> seen;
  std::vector<std::vector<size_t>> out;
  for (size_t i : indices) {
    size_t k = 0;
    while (k < seen.size() && seen[k] != dtypes[i]) ++k;
    if (k == seen.size()) {
      seen.push_back(dtypes[i]);
      out.emplace_back();
    }
    out[k].push_back(i);
  }
  return out;
}

}  // namespace

std::vector<ParamSpec> trainable_specs(torch::nn::Module& model) {
  std::vector<ParamSpec> out;
  for (const auto& item : model.named_parameters(true))
    if (item.value().requires_grad()) out.push_back({item.key(), item.value().sizes().vec()});
  return out;
}

std::vector<c10::ScalarType> trainable_dtypes(torch::nn::Module& model) {
  std::vector<c10::ScalarType> out;
  for (const auto& item : model.named_parameters(true))
    if (item.value().requires_grad()) out.push_back(item.value().scalar_type());
  return out;
}

UnitLayout plan_units(torch::nn::Module& model, const std::vector<ParamSpec>& specs,
                      const std::vector<c10::ScalarType>& dtypes, const ShardedOptions& options) {
  UnitLayout layout;
  std::vector<size_t> all(specs.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  if (options.stage != ShardStage::kFsdp) {
    for (const auto& group : by_dtype(all, dtypes)) {
      // dist.bucket_mb is bytes: a unit of fp16 parameters holds twice the elements of a float32 one.
      const auto width = static_cast<double>(c10::elementSize(dtypes[group.front()]));
      const auto cap = std::max<int64_t>(1, static_cast<int64_t>(options.bucket_mb * (1 << 20) / width));
      std::vector<ParamSpec> sub;
      for (size_t i : group) sub.push_back(specs[i]);
      for (const auto& unit : ShardPlan::bucket_units(sub, cap)) {
        std::vector<size_t> mapped;
        for (size_t j : unit) mapped.push_back(group[j]);
        layout.blocks.push_back({layout.units.size()});
        layout.units.push_back(std::move(mapped));
      }
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
    auto groups = by_dtype(block, dtypes);
    if (groups.empty()) groups.emplace_back();
    for (auto& g : groups) {
      layout.blocks.back().push_back(layout.units.size());
      layout.units.push_back(std::move(g));
    }
  }
  return layout;
}

void check_replicas_match(const std::vector<std::string>& names, const std::vector<at::Tensor>& params,
                          Communicator& comm, const std::string& who) {
  const int world = comm.size();
  if (world == 1) return;
  size_t h = 1469598103934665603ull;  // FNV-1a over the names, shapes and dtypes
  auto mix = [&h](size_t v) { h = (h ^ v) * 1099511628211ull; };
  for (size_t i = 0; i < params.size(); ++i) {
    mix(std::hash<std::string>{}(names[i]));
    for (auto d : params[i].sizes()) mix(static_cast<size_t>(d));
    mix(static_cast<size_t>(params[i].scalar_type()));
  }
  auto mine = at::full({1}, static_cast<int64_t>(h & 0x7fffffffffffffffull), at::kLong);
  auto all = at::zeros({world}, at::kLong);
  comm.all_gather(all, mine, who + " model check")->wait();
  for (int r = 1; r < world; ++r)
    if (all[r].item<int64_t>() != all[0].item<int64_t>())
      throw CommError("rank " + std::to_string(comm.rank()) + ": " + who + ": rank " + std::to_string(r) +
                          " built a model whose parameter names, shapes or dtypes differ from rank 0's",
                      "every rank must build the same model with the same config");
}

void broadcast_from_rank0(const std::vector<at::Tensor>& tensors, Communicator& comm, const std::string& what) {
  if (comm.size() == 1 || tensors.empty()) return;
  at::NoGradGuard no_grad;
  std::map<c10::ScalarType, std::vector<at::Tensor>> by_type;
  for (const auto& t : tensors) by_type[t.scalar_type()].push_back(t);
  for (auto& [type, ts] : by_type) {
    std::vector<at::Tensor> flat_parts;
    for (const auto& t : ts) flat_parts.push_back(t.reshape(-1));
    auto flat = at::cat(flat_parts);
    comm.broadcast(flat, 0, what)->wait();
    int64_t off = 0;
    for (auto& t : ts) {
      t.copy_(flat.narrow(0, off, t.numel()).view(t.sizes()));
      off += t.numel();
    }
  }
}

}  // namespace cohort::shard

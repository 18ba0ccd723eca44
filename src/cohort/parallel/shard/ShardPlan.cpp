#include "cohort/parallel/shard/ShardPlan.h"

#include <algorithm>

#include "cohort/util/Error.h"

namespace cohort::parallel::shard {

ShardPlan::ShardPlan(std::vector<ParamSpec> params, std::vector<std::vector<size_t>> units, int world)
    : params_(std::move(params)), world_(world) {
  if (world < 1) throw Error("shard plan: world size must be at least 1, got " + std::to_string(world));
  constexpr size_t kNone = static_cast<size_t>(-1);
  unit_of_.assign(params_.size(), kNone);
  for (size_t u = 0; u < units.size(); ++u) {
    Unit unit;
    for (size_t p : units[u]) {
      if (p >= params_.size())
        throw Error("shard plan: unit " + std::to_string(u) + " names parameter " + std::to_string(p) + " of " +
                    std::to_string(params_.size()));
      if (unit_of_[p] != kNone)
        throw Error("shard plan: parameter '" + params_[p].name + "' is in units " + std::to_string(unit_of_[p]) +
                    " and " + std::to_string(u));
      unit_of_[p] = u;
      unit.params.push_back(p);
      unit.offsets.push_back(unit.numel);
      unit.numel += params_[p].numel();
    }
    unit.padded = (unit.numel + world - 1) / world * world;
    unit.shard = unit.padded / world;
    units_.push_back(std::move(unit));
  }
  for (size_t p = 0; p < params_.size(); ++p)
    if (unit_of_[p] == kNone) throw Error("shard plan: parameter '" + params_[p].name + "' is in no unit");
}

std::vector<Range> ShardPlan::ranges(size_t u, int rank) const {
  const auto& unit = units_.at(u);
  const int64_t begin = rank * unit.shard, end = begin + unit.shard;
  std::vector<Range> out;
  for (size_t k = 0; k < unit.params.size(); ++k) {
    const int64_t p_begin = unit.offsets[k], p_end = p_begin + params_[unit.params[k]].numel();
    const int64_t lo = std::max(begin, p_begin), hi = std::min(end, p_end);
    if (lo < hi) out.push_back({unit.params[k], lo - p_begin, lo - begin, hi - lo});
  }
  return out;
}

int64_t ShardPlan::shard_numel() const {
  int64_t n = 0;
  for (const auto& u : units_) n += u.shard;
  return n;
}

int64_t ShardPlan::total_numel() const {
  int64_t n = 0;
  for (const auto& p : params_) n += p.numel();
  return n;
}

}  // namespace cohort::parallel::shard

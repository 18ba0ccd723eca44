#include "cohort/parallel/shard/OptimizerSlices.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "cohort/checkpoint/Names.h"
#include "cohort/util/Error.h"

namespace cohort::parallel::shard {

OptimizerSlices::OptimizerSlices(const OptimConfig& cfg, const ShardPlan& plan, FlatUnits& units,
                                 const Trainable& trainable, int rank)
    : plan_(plan), units_(units), names_(trainable.names) {
  const auto rule = group_rule(cfg);
  auto all = optim::make_groups(rule);
  std::vector<std::tuple<size_t, size_t, size_t>> where;  // per piece: unit, group in `all`, index there
  for (size_t u = 0; u < units_.size(); ++u) {
    for (const auto& r : plan_.ranges(u, rank)) {
      auto piece = units_[u].master.narrow(0, r.shard_offset, r.length).detach();
      piece.set_requires_grad(true);
      // 16-bit units get float32 gradients at each step (Note [Sharding 16-bit weights]).
      if (!units_[u].sixteen_bit()) piece.mutable_grad() = units_[u].grad_shard.narrow(0, r.shard_offset, r.length);
      auto& g = all[optim::group_index(names_[r.param], trainable.params[r.param].dim(), rule)];
      where.emplace_back(u, static_cast<size_t>(&g - all.data()), g.params.size());
      g.names.push_back(names_[r.param]);
      g.params.push_back(piece);
      slots_.push_back({u, r, piece});
    }
  }
  std::vector<optim::ParamGroup> groups;
  std::vector<size_t> kept(all.size());  // index in `groups` of each non-empty group of `all`
  for (size_t gi = 0; gi < all.size(); ++gi)
    if (!all[gi].params.empty()) {
      kept[gi] = groups.size();
      groups.push_back(std::move(all[gi]));
    }
  members_.assign(units_.size(), std::vector<std::vector<size_t>>(groups.size()));
  for (const auto& [u, gi, i] : where) members_[u][kept[gi]].push_back(i);
  optimizer_ = optim::make_optimizer(cfg, std::move(groups));
}

void OptimizerSlices::step(double lr, const std::vector<at::Tensor>& grads) {
  for (auto& slot : slots_)
    if (units_[slot.unit].sixteen_bit())
      slot.piece.mutable_grad() = grads[slot.unit].narrow(0, slot.range.shard_offset, slot.range.length);
  optimizer_->step(lr);
  for (auto& slot : slots_)
    if (units_[slot.unit].sixteen_bit()) slot.piece.mutable_grad().reset();
}

void OptimizerSlices::update(double lr, size_t unit, const at::Tensor& grad) {
  const bool copy = units_[unit].sixteen_bit();
  for (auto& slot : slots_)
    if (copy && slot.unit == unit)
      slot.piece.mutable_grad() = grad.narrow(0, slot.range.shard_offset, slot.range.length);
  optimizer_->update(lr, members_[unit]);
  for (auto& slot : slots_)
    if (copy && slot.unit == unit) slot.piece.mutable_grad().reset();
}

void OptimizerSlices::fill_save(checkpoint::ShardedSave& save) const {
  std::map<std::string, at::Tensor> state;
  for (auto& [k, t] : optimizer_->state_dict()) state[k] = t;
  save.layout.optimizer = optimizer_->name();
  save.layout.kinds = state.empty() ? std::vector<std::string>{} : optimizer_->state_kinds();
  for (size_t u = 0; u < units_.size(); ++u) save.params.push_back(units_[u].master);
  for (const auto& kind : save.layout.kinds) {
    auto& per_unit = save.state[kind];
    for (size_t u = 0; u < units_.size(); ++u) per_unit.push_back(at::zeros({plan_.unit(u).shard}, at::kFloat));
    for (const auto& s : slots_)
      if (auto it = state.find(kind + "." + names_[s.range.param]); it != state.end())
        per_unit[s.unit].narrow(0, s.range.shard_offset, s.range.length).copy_(it->second.reshape(-1));
  }
  if (auto it = state.find(checkpoint::names::kOptimizerStep); it != state.end()) save.optimizer_step = it->second;
}

// This rank's piece of the full per-parameter tensor `key`, or undefined if none was saved.
at::Tensor OptimizerSlices::piece_of(const std::map<std::string, at::Tensor>& full, const std::string& key,
                                     const Slot& s) const {
  auto it = full.find(key);
  if (it == full.end()) return {};
  const auto numel = plan_.params()[s.range.param].numel();
  if (it->second.numel() != numel)
    throw CheckpointError("optimizer state '" + key + "' has " + std::to_string(it->second.numel()) +
                              " elements but the parameter has " + std::to_string(numel),
                          "resume with the model configuration the checkpoint was saved with");
  return it->second.reshape(-1).narrow(0, s.range.param_offset, s.range.length);
}

bool OptimizerSlices::load(const optim::NamedState& full) {
  std::map<std::string, at::Tensor> by_name(full.begin(), full.end());
  optim::NamedState mine;
  for (const auto& kind : optimizer_->state_kinds())
    for (const auto& s : slots_) {
      const auto key = kind + "." + names_[s.range.param];
      if (auto t = piece_of(by_name, key, s); t.defined()) mine.emplace_back(key, t.clone());
    }
  const auto& step = checkpoint::names::kOptimizerStep;
  if (by_name.count(step)) mine.emplace_back(step, by_name[step]);
  optimizer_->load_state_dict(mine);
  // fp16-master's float32 weights (master.<name>: from a ddp save, or a sharded save's weights, which
  // are its masters) become this rank's master slices, more exact than the 16-bit weights rounded from
  // them. Whether any were saved is decided from the names, the same on every rank, not from this
  // rank's slots (a rank may own only padding, or only float32 parameters).
  at::NoGradGuard no_grad;
  const auto& prefix = checkpoint::names::kMasterPrefix;
  for (const auto& s : slots_)
    if (auto t = piece_of(by_name, prefix + names_[s.range.param], s); t.defined())
      units_[s.unit].master.narrow(0, s.range.shard_offset, s.range.length).copy_(t);
  return std::any_of(names_.begin(), names_.end(), [&](const std::string& n) { return by_name.count(prefix + n) > 0; });
}

}  // namespace cohort::parallel::shard

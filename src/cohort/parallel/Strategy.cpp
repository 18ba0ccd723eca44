#include "cohort/parallel/Strategy.h"

namespace cohort::parallel {

at::Tensor squared_sum(const std::vector<at::Tensor>& tensors) {
  at::Tensor sq;
  for (const auto& t : tensors) {
    if (!t.defined()) continue;
    auto s = t.to(at::kDouble).pow(2).sum();
    sq = sq.defined() ? sq + s : s;  // added in order, as a host loop would
  }
  return sq.defined() ? sq : at::zeros({}, at::kDouble);
}

optim::GroupRule group_rule(const OptimConfig& cfg) {
  return {cfg.weight_decay, cfg.decay_norm_and_bias, cfg.norm_lr_scale};
}

}  // namespace cohort::parallel

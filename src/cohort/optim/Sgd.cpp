#include "cohort/optim/Sgd.h"

#include <cmath>
#include <map>

#include <ATen/core/grad_mode.h>

#include "cohort/util/Error.h"
#include "cohort/util/TorchCompat.h"

namespace cohort::optim {

std::vector<ParamGroup> make_groups(const GroupRule& rule) {
  std::vector<ParamGroup> g(3);
  g[0].weight_decay = rule.weight_decay;
  g[2].lr_scale = rule.norm_lr_scale;
  g[2].weight_decay = rule.weight_decay / rule.norm_lr_scale;
  return g;
}

size_t group_index(const std::string& name, int64_t dim, const GroupRule& rule) {
  const bool decay = rule.decay_all || dim > 1;
  if (rule.norm_lr_scale != 1.0 && name.find("norm") != std::string::npos) return decay ? 2 : 1;
  return decay ? 0 : 1;
}

std::vector<ParamGroup> split_groups(const torch::OrderedDict<std::string, at::Tensor>& named, const GroupRule& rule) {
  auto groups = make_groups(rule);
  for (const auto& item : named) {
    if (!item.value().requires_grad()) continue;
    auto& g = groups[group_index(item.key(), item.value().dim(), rule)];
    g.names.push_back(item.key());
    g.params.push_back(item.value());
  }
  std::vector<ParamGroup> out;
  for (auto& g : groups)
    if (!g.params.empty()) out.push_back(std::move(g));
  return out;
}

std::vector<ParamGroup> split_decay(const torch::OrderedDict<std::string, at::Tensor>& named, double weight_decay,
                                    bool decay_all) {
  return split_groups(named, GroupRule{weight_decay, decay_all, 1.0});
}

Optimizer::Optimizer(std::vector<ParamGroup> groups) : groups_(std::move(groups)) {
  for (const auto& g : groups_) frozen_.emplace_back(g.params.size(), false);
}

void Optimizer::freeze(const std::string& name) {
  for (size_t gi = 0; gi < groups_.size(); ++gi)
    for (size_t i = 0; i < groups_[gi].names.size(); ++i)
      if (groups_[gi].names[i] == name) frozen_[gi][i] = true;
}

void Optimizer::zero_grad() {
  for (auto& g : groups_)
    for (auto& p : g.params)
      if (p.grad().defined()) p.mutable_grad().reset();
}

int64_t Optimizer::state_bytes() const {
  int64_t n = 0;
  for (const auto& [name, t] : state_dict()) n += t.numel() * static_cast<int64_t>(t.element_size());
  return n;
}

std::pair<size_t, size_t> Optimizer::locate(const std::string& key, const std::string& kind) const {
  const auto prefix = kind + ".";
  if (key.rfind(prefix, 0) == 0) {
    const auto name = key.substr(prefix.size());
    for (size_t gi = 0; gi < groups_.size(); ++gi)
      for (size_t i = 0; i < groups_[gi].names.size(); ++i)
        if (groups_[gi].names[i] == name) return {gi, i};
  }
  throw CheckpointError(
      "optimizer state has '" + key + "', which matches no parameter of this model for " + name() + "'s '" + kind + "'",
      "resume with the optim.name, model.name and model.width the checkpoint was saved with");
}

void Optimizer::check_shape(const std::string& key, const at::Tensor& t, const at::Tensor& p) const {
  if (t.sizes() != p.sizes())
    throw CheckpointError("optimizer state '" + key + "' has shape " + c10::str(t.sizes()) + " but the parameter has " +
                              c10::str(p.sizes()),
                          "resume with the same model configuration the checkpoint was saved with");
}

bool use_foreach(const std::string& setting, const std::vector<ParamGroup>& groups) {
  if (setting != "auto") return setting == "true";
  for (const auto& g : groups)
    if (!g.params.empty()) return g.params.front().is_cuda();
  return false;
}

std::unique_ptr<Optimizer> make_optimizer(const OptimConfig& cfg, std::vector<ParamGroup> groups) {
  const bool foreach = use_foreach(cfg.foreach, groups);
  if (cfg.name == "adamw")
    return std::make_unique<AdamW>(std::move(groups), AdamWOptions{cfg.beta1, cfg.beta2, cfg.eps, foreach});
  return std::make_unique<Sgd>(std::move(groups), SgdOptions{cfg.momentum, cfg.nesterov, foreach});
}

Sgd::Sgd(std::vector<ParamGroup> groups, SgdOptions options) : Optimizer(std::move(groups)), options_(options) {
  for (const auto& g : groups_) momentum_.emplace_back(g.params.size());
}

// Note [One call per operation per group]
// With optim.foreach, SGD and AdamW update a whole parameter group with one at::_foreach_* call per
// operation (torch.optim's multi-tensor implementation, its default on CUDA).
// - Why: on CUDA every ATen call on one tensor is a kernel launch of a few microseconds of host time.
//   ResNet-50 has 161 parameters, and Nesterov SGD with weight decay is 5 operations on each: about 800
//   launches a step, exposed whenever the host waited for the GPU just before (the fp16 overflow check
//   does). The multi-tensor kernels take up to a few hundred tensors per launch.
// - Same numbers: each _foreach_ call applies the per-tensor operation the loop applies, in the same
//   order. On CPU ATen runs it as a loop over the same per-tensor kernels, so the two are bitwise equal
//   there and only the dispatch cost differs (tests/unit/optim). The CUDA kernels compute in the same
//   opmath type; they may round a fused multiply-add differently.
// - LibTorch 1.13 has no _foreach_lerp_: AdamW's first moment there is m + (1 - beta1) * (g - m) in two
//   calls, lerp's own formula for weights under 0.5, rounded once more.
// - What stays per tensor: state created on a parameter's first step (a momentum buffer is a clone of
//   its first update, as in torch.optim), since that happens once.
// - Default (optim.foreach=auto): on where the parameters are on CUDA, as in torch.optim. Off on CPU: there
//   it was faster for models under 2M parameters in some runs and not in others, and 1.1 to 1.9x slower
//   for ResNet-18, ResNet-50 and ViT-B/32, whose tensors a loop keeps in cache across their operations
//   (docs/optimizer.md).
std::vector<size_t> Optimizer::live(size_t group, const std::vector<size_t>& which) const {
  std::vector<size_t> out;
  const auto& g = groups_[group];
  for (size_t i : which)
    if (g.params[i].grad().defined() && !frozen(group, i)) out.push_back(i);
  return out;
}

void Optimizer::step(double lr) {
  std::vector<std::vector<size_t>> every(groups_.size());
  for (size_t gi = 0; gi < groups_.size(); ++gi)
    for (size_t i = 0; i < groups_[gi].params.size(); ++i) every[gi].push_back(i);
  begin_step();
  update(lr, every);
}

void Optimizer::update(double lr, const std::vector<std::vector<size_t>>& which) {
  at::NoGradGuard no_grad;
  for (size_t gi = 0; gi < groups_.size() && gi < which.size(); ++gi) {
    const auto idx = live(gi, which[gi]);
    if (!idx.empty()) update_group(gi, lr * groups_[gi].lr_scale, idx);
  }
}

void Sgd::update_group(size_t gi, double glr, const std::vector<size_t>& live) {
  if (options_.foreach)
    step_foreach(gi, glr, live);
  else
    step_each(gi, glr, live);
}

void Sgd::step_each(size_t gi, double glr, const std::vector<size_t>& idx) {
  auto& g = groups_[gi];
  for (size_t i : idx) {
    auto& p = g.params[i];
    at::Tensor d = p.grad();
    if (g.weight_decay != 0) d = d.add(p, g.weight_decay);
    if (options_.momentum != 0) {
      auto& buf = momentum_[gi][i];
      if (!buf.defined())
        buf = d.clone();
      else
        buf.mul_(options_.momentum).add_(d);
      d = options_.nesterov ? d.add(buf, options_.momentum) : buf;
    }
    p.add_(d, -glr);
  }
}

void Sgd::step_foreach(size_t gi, double glr, const std::vector<size_t>& idx) {
  auto& g = groups_[gi];
  std::vector<at::Tensor> params, d;
  for (size_t i : idx) {
    params.push_back(g.params[i]);
    d.push_back(g.params[i].grad());
  }
  // `d` holds the gradients themselves until an out-of-place call gives it tensors of its own.
  bool d_owned = false;
  if (g.weight_decay != 0) {
    d = at::_foreach_add(d, params, g.weight_decay);
    d_owned = true;
  }
  if (options_.momentum != 0) {
    std::vector<at::Tensor> bufs, old_bufs, old_d;
    for (size_t k = 0; k < idx.size(); ++k) {
      auto& buf = momentum_[gi][idx[k]];
      if (!buf.defined()) {
        buf = d[k].clone();
      } else {
        old_bufs.push_back(buf);
        old_d.push_back(d[k]);
      }
      bufs.push_back(buf);
    }
    if (!old_bufs.empty()) {
      at::_foreach_mul_(old_bufs, options_.momentum);
      at::_foreach_add_(old_bufs, old_d);
    }
    if (!options_.nesterov)
      d = bufs;
    else if (d_owned)
      at::_foreach_add_(d, bufs, options_.momentum);
    else
      d = at::_foreach_add(d, bufs, options_.momentum);
  }
  at::_foreach_add_(params, d, -glr);
}

NamedState Sgd::state_dict() const {
  NamedState out;
  for (size_t gi = 0; gi < groups_.size(); ++gi)
    for (size_t i = 0; i < groups_[gi].params.size(); ++i)
      if (momentum_[gi][i].defined()) out.emplace_back("momentum_buffer." + groups_[gi].names[i], momentum_[gi][i]);
  return out;
}

void Sgd::load_state_dict(const NamedState& state) {
  for (const auto& [name, t] : state) {
    const auto [gi, i] = locate(name, "momentum_buffer");
    const auto& p = groups_[gi].params[i];
    check_shape(name, t, p);
    momentum_[gi][i] = t.to(p.options()).clone();
  }
}

AdamW::AdamW(std::vector<ParamGroup> groups, AdamWOptions options) : Optimizer(std::move(groups)), options_(options) {
  for (const auto& g : groups_) {
    exp_avg_.emplace_back(g.params.size());
    exp_avg_sq_.emplace_back(g.params.size());
  }
}

void AdamW::begin_step() {
  ++step_;
  bias1_ = 1 - std::pow(options_.beta1, static_cast<double>(step_));
  bias2_sqrt_ = std::sqrt(1 - std::pow(options_.beta2, static_cast<double>(step_)));
}

void AdamW::update_group(size_t gi, double glr, const std::vector<size_t>& live) {
  if (options_.foreach)
    step_foreach(gi, glr, live);
  else
    step_each(gi, glr, live);
}

void AdamW::step_each(size_t gi, double glr, const std::vector<size_t>& idx) {
  auto& g = groups_[gi];
  const double b1 = options_.beta1, b2 = options_.beta2;
  const double step_size = glr / bias1_;
  for (size_t i : idx) {
    auto& p = g.params[i];
    const at::Tensor& grad = p.grad();
    if (g.weight_decay != 0) p.mul_(1 - glr * g.weight_decay);
    auto& m = exp_avg_[gi][i];
    auto& v = exp_avg_sq_[gi][i];
    if (!m.defined()) {
      m = at::zeros_like(p);
      v = at::zeros_like(p);
    }
    m.lerp_(grad, 1 - b1);
    v.mul_(b2).addcmul_(grad, grad, 1 - b2);
    auto denom = (v.sqrt() / bias2_sqrt_).add_(options_.eps);
    p.addcdiv_(m, denom, -step_size);
  }
}

void AdamW::step_foreach(size_t gi, double glr, const std::vector<size_t>& idx) {
  auto& g = groups_[gi];
  const double b1 = options_.beta1, b2 = options_.beta2;
  const double step_size = glr / bias1_;
  std::vector<at::Tensor> params, grads, m, v;
  for (size_t i : idx) {
    auto& p = g.params[i];
    if (!exp_avg_[gi][i].defined()) {
      exp_avg_[gi][i] = at::zeros_like(p);
      exp_avg_sq_[gi][i] = at::zeros_like(p);
    }
    params.push_back(p);
    grads.push_back(p.grad());
    m.push_back(exp_avg_[gi][i]);
    v.push_back(exp_avg_sq_[gi][i]);
  }
  if (g.weight_decay != 0) at::_foreach_mul_(params, 1 - glr * g.weight_decay);
  util::compat::foreach_lerp_(m, grads, 1 - b1);
  at::_foreach_mul_(v, b2);
  at::_foreach_addcmul_(v, grads, grads, 1 - b2);
  auto denom = at::_foreach_sqrt(v);
  at::_foreach_div_(denom, bias2_sqrt_);
  at::_foreach_add_(denom, options_.eps);
  at::_foreach_addcdiv_(params, m, denom, -step_size);
}

NamedState AdamW::state_dict() const {
  NamedState out;
  for (size_t gi = 0; gi < groups_.size(); ++gi)
    for (size_t i = 0; i < groups_[gi].params.size(); ++i)
      if (exp_avg_[gi][i].defined()) {
        out.emplace_back("exp_avg." + groups_[gi].names[i], exp_avg_[gi][i]);
        out.emplace_back("exp_avg_sq." + groups_[gi].names[i], exp_avg_sq_[gi][i]);
      }
  if (step_ > 0) out.emplace_back("step", at::tensor({static_cast<double>(step_)}, at::kDouble).reshape({}));
  return out;
}

void AdamW::load_state_dict(const NamedState& state) {
  for (const auto& [name, t] : state) {
    if (name == "step") {
      step_ = static_cast<int64_t>(t.item<double>());
      continue;
    }
    const bool sq = name.rfind("exp_avg_sq.", 0) == 0;
    const auto [gi, i] = locate(name, sq ? "exp_avg_sq" : "exp_avg");
    const auto& p = groups_[gi].params[i];
    check_shape(name, t, p);
    (sq ? exp_avg_sq_ : exp_avg_)[gi][i] = t.to(p.options()).clone();
  }
}

}  // namespace cohort::optim

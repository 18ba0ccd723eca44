#include "cohort/optim/Sgd.h"

#include <map>

#include <ATen/core/grad_mode.h>

#include "cohort/util/Error.h"

namespace cohort::optim {

std::vector<ParamGroup> split_decay(const torch::OrderedDict<std::string, at::Tensor>& named, double weight_decay,
                                    bool decay_all) {
  ParamGroup decay{{}, {}, weight_decay}, no_decay{{}, {}, 0.0};
  for (const auto& item : named) {
    if (!item.value().requires_grad()) continue;
    auto& g = (decay_all || item.value().dim() > 1) ? decay : no_decay;
    g.names.push_back(item.key());
    g.params.push_back(item.value());
  }
  std::vector<ParamGroup> out;
  if (!decay.params.empty()) out.push_back(std::move(decay));
  if (!no_decay.params.empty()) out.push_back(std::move(no_decay));
  return out;
}

Sgd::Sgd(std::vector<ParamGroup> groups, SgdOptions options) : groups_(std::move(groups)), options_(options) {
  for (const auto& g : groups_) momentum_.emplace_back(g.params.size());
}

void Sgd::step(double lr) {
  at::NoGradGuard no_grad;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    auto& g = groups_[gi];
    for (size_t i = 0; i < g.params.size(); ++i) {
      auto& p = g.params[i];
      if (!p.grad().defined()) continue;
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
      p.add_(d, -lr);
    }
  }
}

void Sgd::zero_grad() {
  for (auto& g : groups_)
    for (auto& p : g.params)
      if (p.grad().defined()) p.mutable_grad().reset();
}

std::vector<std::pair<std::string, at::Tensor>> Sgd::state_dict() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (size_t gi = 0; gi < groups_.size(); ++gi)
    for (size_t i = 0; i < groups_[gi].params.size(); ++i)
      if (momentum_[gi][i].defined()) out.emplace_back("momentum_buffer." + groups_[gi].names[i], momentum_[gi][i]);
  return out;
}

void Sgd::load_state_dict(const std::vector<std::pair<std::string, at::Tensor>>& state) {
  std::map<std::string, std::pair<size_t, size_t>> where;
  for (size_t gi = 0; gi < groups_.size(); ++gi)
    for (size_t i = 0; i < groups_[gi].params.size(); ++i) where["momentum_buffer." + groups_[gi].names[i]] = {gi, i};
  for (const auto& [name, t] : state) {
    auto it = where.find(name);
    if (it == where.end())
      throw CheckpointError("optimizer state has '" + name + "', which matches no parameter of this model",
                            "resume with the same model.name and model.width the checkpoint was saved with");
    const auto [gi, i] = it->second;
    const auto& p = groups_[gi].params[i];
    if (t.sizes() != p.sizes())
      throw CheckpointError("optimizer state '" + name + "' has shape " + c10::str(t.sizes()) + " but the parameter has " +
                                c10::str(p.sizes()),
                            "resume with the same model configuration the checkpoint was saved with");
    momentum_[gi][i] = t.to(p.options()).clone();
  }
}

}  // namespace cohort::optim

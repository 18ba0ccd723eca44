#include "cohort/amp/MasterWeights.h"

#include <torch/nn/modules/batchnorm.h>

#include "cohort/util/Error.h"

namespace cohort::amp {
namespace {

bool is_batchnorm(const torch::nn::Module& m) {
  return dynamic_cast<const torch::nn::BatchNorm1dImpl*>(&m) || dynamic_cast<const torch::nn::BatchNorm2dImpl*>(&m) ||
         dynamic_cast<const torch::nn::BatchNorm3dImpl*>(&m);
}

}  // namespace

void keep_batchnorm_fp32_else_half(torch::nn::Module& model) {
  at::NoGradGuard no_grad;
  for (const auto& m : model.modules(/*include_self=*/true)) {
    if (is_batchnorm(*m)) continue;
    // Direct members only: children are visited on their own, and batch-norm children must be skipped.
    for (auto& p : m->named_parameters(/*recurse=*/false))
      if (p.value().is_floating_point()) p.value().set_data(p.value().to(at::kHalf));
    for (auto& b : m->named_buffers(/*recurse=*/false))
      if (b.value().is_floating_point()) b.value().set_data(b.value().to(at::kHalf));
  }
}

MasterWeights::MasterWeights(const torch::OrderedDict<std::string, at::Tensor>& params) {
  at::NoGradGuard no_grad;
  for (const auto& item : params) {
    const auto& p = item.value();
    if (!p.requires_grad()) continue;
    if (p.scalar_type() == at::kFloat || p.scalar_type() == at::kDouble) {
      targets_.insert(item.key(), p);
      continue;
    }
    // A leaf that requires grad, as Apex's master nn.Parameters: the optimizer's grouping takes only those.
    auto master = p.detach().to(at::kFloat).clone().set_requires_grad(true);
    pairs_.push_back({item.key(), p, master});
    targets_.insert(item.key(), master);
    active_ = true;
  }
}

void MasterWeights::grads_to_master() {
  at::NoGradGuard no_grad;
  for (auto& pair : pairs_) {
    if (!pair.model.grad().defined()) continue;
    pair.master.mutable_grad() = pair.model.grad().detach().to(at::kFloat);
  }
}

void MasterWeights::master_to_model() {
  at::NoGradGuard no_grad;
  for (auto& pair : pairs_) pair.model.detach().copy_(pair.master);
}

void MasterWeights::zero_model_grads() {
  for (auto& pair : pairs_)
    if (pair.model.grad().defined()) pair.model.mutable_grad().reset();
}

optim::NamedState MasterWeights::state_dict() const {
  optim::NamedState out;
  for (const auto& pair : pairs_) out.emplace_back(kMasterPrefix + pair.name, pair.master);
  return out;
}

optim::NamedState MasterWeights::load_state_dict(const optim::NamedState& state) {
  at::NoGradGuard no_grad;
  optim::NamedState rest;
  for (const auto& [name, t] : state) {
    if (name.rfind(kMasterPrefix, 0) != 0) {
      rest.emplace_back(name, t);
      continue;
    }
    const auto param = name.substr(kMasterPrefix.size());
    auto it = std::find_if(pairs_.begin(), pairs_.end(), [&](const Pair& p) { return p.name == param; });
    if (it == pairs_.end()) continue;  // saved under fp16-master, resumed in another precision: the weights suffice
    if (!it->master.sizes().equals(t.sizes()))
      throw CheckpointError("master weight '" + name + "' has the wrong shape for parameter '" + param + "'",
                            "resume with the model the checkpoint was saved with");
    it->master.copy_(t.to(it->master.options()));
  }
  return rest;
}

int64_t MasterWeights::bytes() const {
  int64_t n = 0;
  for (const auto& pair : pairs_) n += pair.master.numel() * static_cast<int64_t>(pair.master.element_size());
  return n;
}

}  // namespace cohort::amp

#include "cohort/optim/Ema.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "cohort/util/Error.h"

namespace cohort::optim {
namespace {

bool is_16_bit(const at::Tensor& t) { return t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16; }

void check_decay(double decay) {
  if (!(decay >= 0.0 && decay <= 1.0))
    throw ConfigError("EMA decay must lie in [0, 1], got " + std::to_string(decay),
                      "typical values are 0.99 to 0.9999 per step; 0 copies the weights, 1 freezes the average");
}

std::string shape_string(const at::Tensor& x) {
  std::string s = "[";
  for (int64_t d = 0; d < x.dim(); ++d) s += (d ? ", " : "") + std::to_string(x.size(d));
  return s + "]";
}

}  // namespace

Ema::Ema(const torch::nn::Module& module, double decay) : decay_(decay) {
  check_decay(decay);
  torch::NoGradGuard no_grad;
  const auto add = [this](const std::string& name, const at::Tensor& t) {
    if (!t.defined() || !t.is_floating_point()) return;
    names_.push_back(name);
    average_.push_back(is_16_bit(t) ? t.detach().to(at::kFloat) : t.detach().clone());
  };
  for (const auto& item : module.named_parameters()) add(item.key(), item.value());
  for (const auto& item : module.named_buffers()) add(item.key(), item.value());
}

// The module's tensors in the order of names_, looked up by name on every call so that a module whose
// tensors were replaced (not just updated in place) is still read correctly.
std::vector<at::Tensor> Ema::module_tensors(const torch::nn::Module& module) const {
  const auto params = module.named_parameters();
  const auto buffers = module.named_buffers();
  std::vector<at::Tensor> out;
  out.reserve(names_.size());
  for (size_t i = 0; i < names_.size(); ++i) {
    const at::Tensor* t = params.find(names_[i]);
    if (t == nullptr) t = buffers.find(names_[i]);
    COHORT_ASSERT(t != nullptr && t->sizes() == average_[i].sizes(),
                  "EMA used with a module other than the one it was built from: '" + names_[i] +
                      (t == nullptr ? "' is missing" : "' has shape " + shape_string(*t)));
    out.push_back(*t);
  }
  return out;
}

void Ema::check_not_swapped(const char* what) const {
  COHORT_ASSERT(!swapped_, std::string("Ema::") + what + " called between swap_in and swap_out");
}

void Ema::update(const torch::nn::Module& module) { update(module, decay_); }

void Ema::update(const torch::nn::Module& module, double decay) {
  check_decay(decay);
  check_not_swapped("update");
  torch::NoGradGuard no_grad;
  const auto tensors = module_tensors(module);
  // lerp_(x, 1 - decay) is decay * average + (1 - decay) * x in one kernel.
  for (size_t i = 0; i < tensors.size(); ++i) average_[i].lerp_(tensors[i].to(average_[i].scalar_type()), 1.0 - decay);
  ++num_updates_;
}

void Ema::lookahead(torch::nn::Module& module, double decay) {
  update(module, decay);
  copy_to(module);
}

void Ema::copy_to(torch::nn::Module& module) const {
  torch::NoGradGuard no_grad;
  const auto tensors = module_tensors(module);
  for (size_t i = 0; i < tensors.size(); ++i) {
    // The module may hold the tensor with requires_grad; copying under no_grad keeps it a leaf.
    at::Tensor target = tensors[i];
    target.copy_(average_[i]);
  }
}

void Ema::swap_in(torch::nn::Module& module) {
  check_not_swapped("swap_in");
  torch::NoGradGuard no_grad;
  const auto tensors = module_tensors(module);
  saved_.clear();
  for (const auto& t : tensors) saved_.push_back(t.detach().clone());
  copy_to(module);
  swapped_ = true;
}

void Ema::swap_out(torch::nn::Module& module) {
  COHORT_ASSERT(swapped_, "Ema::swap_out called without swap_in");
  torch::NoGradGuard no_grad;
  const auto tensors = module_tensors(module);
  for (size_t i = 0; i < tensors.size(); ++i) {
    at::Tensor target = tensors[i];
    target.copy_(saved_[i]);
  }
  saved_.clear();
  swapped_ = false;
}

NamedTensors Ema::state_dict() const {
  NamedTensors out;
  out.reserve(names_.size());
  for (size_t i = 0; i < names_.size(); ++i) out.emplace_back(names_[i], average_[i]);
  return out;
}

void Ema::load_state_dict(const NamedTensors& state) {
  check_not_swapped("load_state_dict");
  std::unordered_map<std::string, const at::Tensor*> by_name;
  for (const auto& entry : state) by_name[entry.first] = &entry.second;
  for (size_t i = 0; i < names_.size(); ++i) {
    const auto it = by_name.find(names_[i]);
    if (it == by_name.end())
      throw CheckpointError("EMA state has no tensor '" + names_[i] + "'",
                            "the checkpoint was written for a different model; start the EMA afresh or load the "
                            "matching checkpoint");
    if (it->second->sizes() != average_[i].sizes())
      throw CheckpointError("EMA state tensor '" + names_[i] + "' has shape " + shape_string(*it->second) +
                                ", the model's is " + shape_string(average_[i]),
                            "the checkpoint was written for a model of another width or number of classes");
  }
  const std::unordered_set<std::string> known(names_.begin(), names_.end());
  for (const auto& entry : state)
    if (known.count(entry.first) == 0)
      throw CheckpointError("EMA state has tensor '" + entry.first + "' that the model does not have",
                            "the checkpoint was written for a different model");
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < names_.size(); ++i) average_[i].copy_(*by_name.at(names_[i]));
}

double Ema::decay_every(double per_step_decay, int64_t k) {
  check_decay(per_step_decay);
  if (k <= 0)
    throw ConfigError("EMA update interval must be positive, got " + std::to_string(k), "update every k >= 1 steps");
  return std::pow(per_step_decay, static_cast<double>(k));
}

double airbench_lookahead_decay(int64_t step, int64_t total_steps, double base, int64_t every, double power) {
  if (total_steps <= 0 || step < 0 || every <= 0)
    throw ConfigError("airbench lookahead decay needs 0 <= step and positive total_steps and every, got step " +
                          std::to_string(step) + ", total_steps " + std::to_string(total_steps) + ", every " +
                          std::to_string(every),
                      "pass the optimizer step count and the planned number of steps");
  const double progress = std::min(1.0, static_cast<double>(step) / static_cast<double>(total_steps));
  return std::pow(base, static_cast<double>(every)) * std::pow(progress, power);
}

}  // namespace cohort::optim

// SGD with momentum and Nesterov, PyTorch's update rule, with state keyed by parameter name so it
// saves to and loads from a checkpoint without depending on tensor addresses.
//
//   auto groups = cohort::optim::split_decay(net->named_parameters(), /*weight_decay=*/5e-4, false);
//   cohort::optim::Sgd opt(groups, {.momentum = 0.9, .nesterov = true});
//   loss.backward(); opt.step(lr); opt.zero_grad();
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/ordered_dict.h>

namespace cohort::optim {

struct ParamGroup {
  std::vector<std::string> names;
  std::vector<at::Tensor> params;
  double weight_decay = 0;
};

// Batch-norm weights and all biases (every parameter of dimension <= 1) get no weight decay unless
// `decay_all`, as the ResNet training recipes do.
std::vector<ParamGroup> split_decay(const torch::OrderedDict<std::string, at::Tensor>& named, double weight_decay,
                                    bool decay_all);

struct SgdOptions {
  double momentum = 0.9;
  bool nesterov = false;
};

class Sgd {
 public:
  Sgd(std::vector<ParamGroup> groups, SgdOptions options);

  // p -= lr * update, with update as torch.optim.SGD computes it (dampening 0).
  void step(double lr);
  void zero_grad();

  // Momentum buffers as "momentum_buffer.<param name>"; parameters without one yet are absent.
  std::vector<std::pair<std::string, at::Tensor>> state_dict() const;
  // Throws CheckpointError naming a tensor that does not match a parameter.
  void load_state_dict(const std::vector<std::pair<std::string, at::Tensor>>& state);

  const std::vector<ParamGroup>& groups() const { return groups_; }

 private:
  std::vector<ParamGroup> groups_;
  SgdOptions options_;
  std::vector<std::vector<at::Tensor>> momentum_;  // per group, per param; undefined until first step
};

}  // namespace cohort::optim

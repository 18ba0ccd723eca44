// fp32 master copies of fp16 parameters (Apex O2, amp.precision=fp16-master): the model computes with
// fp16 weights, the optimizer updates fp32 copies, and the fp16 weights are rounded from them after every
// update, so updates smaller than fp16's spacing (2^-10 at 1.0) still accumulate.
//
//   cohort::amp::keep_batchnorm_fp32_else_half(*model);       // fp16 weights, fp32 batch norm
//   cohort::amp::MasterWeights masters(model->named_parameters());
//   auto opt = make_optimizer(cfg, split_groups(masters.optimizer_params(), rule));
//   loss.backward();
//   masters.grads_to_master();  opt->step(lr);  masters.master_to_model();
#pragma once

#include <string>

#include <torch/nn/module.h>

#include "cohort/checkpoint/Names.h"
#include "cohort/optim/Optimizer.h"

namespace cohort::amp {

// The training-state names of fp32 master weights: "master.<parameter name>", for every strategy (the
// prefix belongs to the checkpoint format).
inline const std::string& kMasterPrefix = checkpoint::names::kMasterPrefix;

// Casts every parameter and buffer of `model` to fp16, except those of batch-norm modules, which stay
// fp32 as Apex O2's keep_batchnorm_fp32 does: their statistics would lose too much in fp16, and cuDNN
// takes fp16 activations with fp32 batch-norm weights.
void keep_batchnorm_fp32_else_half(torch::nn::Module& model);

class MasterWeights {
 public:
  MasterWeights() = default;
  // `params`: the model's named parameters; those that do not require grad are left out.
  explicit MasterWeights(const torch::OrderedDict<std::string, at::Tensor>& params);

  // Whether any parameter is below fp32 (otherwise every call here is a no-op).
  bool active() const { return active_; }
  // What the optimizer updates, by the model's names: the fp32 master of an fp16 parameter, the
  // parameter itself otherwise.
  const torch::OrderedDict<std::string, at::Tensor>& optimizer_params() const { return targets_; }
  // The masters' .grad become the model's gradients in fp32 (still scaled by the loss scale).
  void grads_to_master();
  // Rounds the updated masters into the model's fp16 parameters.
  void master_to_model();
  // Clears the model's own gradients (the optimizer clears the masters').
  void zero_model_grads();

  // "master.<name>" for every fp16 parameter, for the training-state file.
  optim::NamedState state_dict() const;
  // Loads the "master.<name>" entries of `state` and returns the other entries. A checkpoint without
  // masters (saved in another precision) leaves the masters as copies of the loaded weights.
  optim::NamedState load_state_dict(const optim::NamedState& state);
  int64_t bytes() const;

 private:
  struct Pair {
    std::string name;
    at::Tensor model;   // fp16, what forward uses
    at::Tensor master;  // fp32
  };
  std::vector<Pair> pairs_;
  torch::OrderedDict<std::string, at::Tensor> targets_;
  bool active_ = false;
};

}  // namespace cohort::amp

// Image classifiers by name, with torchvision-style parameter names (conv1.weight, layer1.0.bn1.running_mean,
// layer2.0.downsample.0.weight, fc.bias) so checkpoints read like torchvision's.
//
//   auto net = cohort::models::build({.name = "resnet20", .width = 16, .num_classes = 10}, /*in_channels=*/1);
//   at::Tensor logits = net->forward(images);   // [B, num_classes]
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/nn/module.h>

#include "cohort/config/Config.h"

namespace cohort::models {

// LibTorch's Module has no virtual forward; every cohort model is a Classifier so the trainer can call
// forward() on whatever the config names.
class Classifier;

// FSDP's way into a model's forward. LibTorch modules have no forward hooks, so a model calls each of
// its units (a residual block, a transformer block, a stage) through Classifier::run_unit, and a runner
// installed by the FSDP strategy gathers the unit's parameters before and frees them after.
class UnitRunner {
 public:
  virtual ~UnitRunner() = default;
  // Runs unit `index` (its position in units()) by calling `forward`.
  virtual at::Tensor run(size_t index, const std::function<at::Tensor()>& forward) = 0;
  // Runs the whole model's forward (so the root unit, the parameters outside every unit, can be
  // gathered first).
  virtual at::Tensor run_model(const std::function<at::Tensor()>& forward) = 0;
};

// LibTorch's Module has no virtual forward; every cohort model is a Classifier so the trainer can call
// forward() on whatever the config names.
class Classifier : public torch::nn::Module {
 public:
  at::Tensor forward(at::Tensor x) {
    return runner_ ? runner_->run_model([&] { return forward_impl(x); }) : forward_impl(x);
  }
  // The model itself; forward() adds the unit runner's work around it.
  virtual at::Tensor forward_impl(at::Tensor x) = 0;

  // The parameter-name prefixes of the units FSDP gathers one at a time, in forward order, under
  // `policy` ("block": residual or transformer blocks; "child": top-level stages). Parameters under no
  // prefix form the root unit, which stays gathered. Choosing a policy sets how forward() calls units.
  // A model without units returns none: FSDP then shards it as one root unit.
  std::vector<std::string> units(const std::string& policy) {
    unit_policy_ = policy;
    return unit_prefixes(policy);
  }
  void set_unit_runner(UnitRunner* runner) { runner_ = runner; }

 protected:
  virtual std::vector<std::string> unit_prefixes(const std::string& policy) { return {}; }
  at::Tensor run_unit(size_t index, const std::function<at::Tensor()>& fn) {
    return runner_ ? runner_->run(index, fn) : fn();
  }
  bool unit_per_block() const { return unit_policy_ != "child"; }

 private:
  UnitRunner* runner_ = nullptr;
  std::string unit_policy_ = "block";
};

std::shared_ptr<Classifier> build(const ModelConfig& cfg, int64_t in_channels, int64_t image_size);

}  // namespace cohort::models

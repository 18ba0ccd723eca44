// Image classifiers by name, with torchvision-style parameter names (conv1.weight, layer1.0.bn1.running_mean,
// layer2.0.downsample.0.weight, fc.bias) so checkpoints read like torchvision's.
//
//   auto net = cohort::models::build({.name = "resnet20", .width = 16, .num_classes = 10}, /*in_channels=*/1);
//   at::Tensor logits = net->forward(images);   // [B, num_classes]
#pragma once

#include <memory>

#include <torch/nn/module.h>

#include "cohort/config/Config.h"

namespace cohort::models {

// LibTorch's Module has no virtual forward; every cohort model is a Classifier so the trainer can call
// forward() on whatever the config names.
class Classifier : public torch::nn::Module {
 public:
  virtual at::Tensor forward(at::Tensor x) = 0;
};

std::shared_ptr<Classifier> build(const ModelConfig& cfg, int64_t in_channels, int64_t image_size);

}  // namespace cohort::models

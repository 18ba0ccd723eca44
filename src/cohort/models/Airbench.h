// The fast CIFAR-10 network of the airbench94 family (Keller Jordan, "94% on CIFAR-10 in 3.29 seconds"):
// a frozen 2x2 patch-whitening convolution, three conv groups of widths 64/256/256, a global max-pool and a
// bias-free linear head scaled by 1/9. Its speed comes as much from how it is initialised (whitening from the
// data, identity 3x3 filters) as from its shape, so both live here; the optimiser tricks (lookahead, the
// 64x learning rate of BatchNorm biases) belong to the trainer.
//
//   auto net = cohort::models::make_airbench(/*in_channels=*/3, /*num_classes=*/10, /*width_scale=*/1);
//   std::static_pointer_cast<cohort::models::AirbenchNet>(net)->init_whitening(normalized_train_images);
//   at::Tensor logits = net->forward(images);   // images [B, 3, 32, 32] -> logits [B, 10]
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>

#include "cohort/models/Models.h"

namespace cohort::models {

// One airbench conv group: conv3x3 -> maxpool2 -> BatchNorm -> GELU -> conv3x3 -> BatchNorm -> GELU.
// Parameter names below its prefix: conv1.weight, norm1.{weight,bias,running_mean,running_var,
// num_batches_tracked}, conv2.weight, norm2.*.
struct AirbenchConvGroupImpl : torch::nn::Module {
  AirbenchConvGroupImpl(int64_t in_channels, int64_t out_channels);
  at::Tensor forward(at::Tensor x);
  torch::nn::Conv2d conv1{nullptr};
  torch::nn::BatchNorm2d norm1{nullptr};
  torch::nn::Conv2d conv2{nullptr};
  torch::nn::BatchNorm2d norm2{nullptr};
};
TORCH_MODULE(AirbenchConvGroup);

// Parameters, in named_parameters() order (width w = 64 * width_scale, groups i = 0, 1, 2 of widths
// w, 4w, 4w; C = in_channels):
//   whiten.weight        [8C, C, 2, 2]   frozen; set by init_whitening()
//   whiten.bias          [8C]            trained (airbench stops training it after 3 epochs: the trainer's call)
//   layers.i.conv1.weight, layers.i.conv2.weight   3x3, no bias
//   layers.i.norm1.weight, layers.i.norm2.weight   frozen at 1
//   layers.i.norm1.bias,   layers.i.norm2.bias     trained (airbench: 64x learning rate; every name with "norm")
//   head.weight          [num_classes, 4w]  no bias
// Buffers: layers.i.norm{1,2}.{running_mean, running_var, num_batches_tracked}.
class AirbenchNet : public Classifier {
 public:
  // airbench's constants. kBatchNormMomentum is in PyTorch's convention (new = (1 - m) * old + m * batch):
  // airbench writes "momentum 0.6" and passes 1 - 0.6 to nn.BatchNorm2d, i.e. running statistics keep 60%
  // of their old value per step.
  static constexpr double kBatchNormMomentum = 0.4;
  static constexpr double kBatchNormEps = 1e-12;
  static constexpr double kOutputScale = 1.0 / 9.0;
  static constexpr double kWhiteningEps = 5e-4;  // added to the patch covariance's eigenvalues
  static constexpr int64_t kWhiteningKernel = 2;

  AirbenchNet(int64_t in_channels, int64_t num_classes, int64_t width_scale);

  // x [B, in_channels, H, W] with H, W >= 9 (32 for CIFAR-10) -> logits [B, num_classes].
  at::Tensor forward_impl(at::Tensor x) override;

  // Sets whiten.weight from the second-moment matrix of every 2x2 patch of `images` (float [N, C, H, W],
  // already normalized; airbench uses the first 5000 training images): row k is the k-th eigenvector (largest
  // eigenvalue first) divided by sqrt(eigenvalue + kWhiteningEps), and the second half of the rows is the
  // negated first half, so the GELU after it passes both signs. The patch matrix is not centred (airbench's
  // choice: the images are normalized, so the mean is near zero and the trained bias absorbs what is left).
  // The weight stays frozen; whiten.bias is not touched. Throws ConfigError for images of the wrong shape.
  void init_whitening(const at::Tensor& images);

  // Parameters that never train in this architecture: whiten.weight and every BatchNorm weight. They are
  // registered with requires_grad false; the list does not change when a trainer freezes whiten.bias later.
  std::vector<std::string> frozen_parameter_names() const;

  int64_t in_channels() const { return in_channels_; }
  int64_t num_classes() const { return num_classes_; }

  // For tests and for the trainer's parameter groups.
  const torch::nn::Conv2d& whiten() const { return whiten_; }
  const std::vector<AirbenchConvGroup>& groups() const { return groups_; }

 private:
  int64_t in_channels_, num_classes_;
  torch::nn::Conv2d whiten_{nullptr};
  std::vector<AirbenchConvGroup> groups_;
  torch::nn::Linear head_{nullptr};
};

// Identity ("dirac") initialisation as airbench's Conv.reset_parameters: after LibTorch's default init, the
// filters of the first min(in, out) output channels are replaced by dirac_ (output channel i copies input
// channel i through the kernel's centre, index k/2, and ignores the others); the remaining output channels
// keep their default init, and a bias, if any, is zeroed. Exposed so the tests and other models can reuse it.
void airbench_dirac_init_(torch::nn::Conv2d& conv);

// airbench94 for `in_channels`-channel images; width_scale 1 gives widths 64/256/256. Throws ConfigError for
// non-positive arguments.
std::shared_ptr<Classifier> make_airbench(int64_t in_channels, int64_t num_classes, int64_t width_scale);

}  // namespace cohort::models

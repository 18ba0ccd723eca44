#include "cohort/models/Airbench.h"

#include <torch/torch.h>

#include <algorithm>
#include <string>
#include <tuple>
#include <vector>

#include "cohort/util/Error.h"

namespace cohort::models {
namespace {

namespace nn = torch::nn;

// airbench's BatchNorm: the scale is fixed at 1 and never trained (only the shift is), which together with
// the fast running-statistics momentum is what lets the 3x3 convolutions train at a high learning rate.
nn::BatchNorm2d airbench_batch_norm(int64_t channels) {
  nn::BatchNorm2d bn(
      nn::BatchNorm2dOptions(channels).eps(AirbenchNet::kBatchNormEps).momentum(AirbenchNet::kBatchNormMomentum));
  // The weight is already 1 (LibTorch's default); only its trainability changes. set_requires_grad acts on
  // the tensor the module registered, so named_parameters() sees it.
  bn->weight.set_requires_grad(false);
  return bn;
}

nn::Conv2d conv3x3(int64_t in_channels, int64_t out_channels) {
  // padding 1 is airbench's padding='same' for a 3x3 kernel.
  nn::Conv2d conv(nn::Conv2dOptions(in_channels, out_channels, 3).padding(1).bias(false));
  airbench_dirac_init_(conv);
  return conv;
}

std::string shape_string(const at::Tensor& x) {
  std::string s = "[";
  for (int64_t d = 0; d < x.dim(); ++d) s += (d ? ", " : "") + std::to_string(x.size(d));
  return s + "]";
}

// Images this small still leave a 1x1 map after the 2x2 whitening conv and three 2x2 max-pools.
constexpr int64_t kMinImageSize = 9;

}  // namespace

void airbench_dirac_init_(nn::Conv2d& conv) {
  torch::NoGradGuard no_grad;
  at::Tensor w = conv->weight;  // [out, in, kh, kw], already default-initialised by the constructor
  const int64_t identity_channels = std::min(w.size(0), w.size(1));
  // airbench writes dirac_(w[:w.size(1)]): dirac_ zeroes the slice, then puts a 1 at the kernel centre of
  // (i, i) for i < min(out, in). Output channels beyond in_channels keep the default init, so they start
  // as random features next to the identity ones.
  nn::init::dirac_(w.narrow(0, 0, identity_channels));
  if (conv->bias.defined()) conv->bias.zero_();
}

AirbenchConvGroupImpl::AirbenchConvGroupImpl(int64_t in_channels, int64_t out_channels)
    : conv1(register_module("conv1", conv3x3(in_channels, out_channels))),
      norm1(register_module("norm1", airbench_batch_norm(out_channels))),
      conv2(register_module("conv2", conv3x3(out_channels, out_channels))),
      norm2(register_module("norm2", airbench_batch_norm(out_channels))) {}

at::Tensor AirbenchConvGroupImpl::forward(at::Tensor x) {
  // Pooling before the BatchNorm (not after the second conv) is airbench's order; it makes the second conv
  // run at the pooled resolution.
  x = torch::max_pool2d(conv1(x), 2);
  x = torch::gelu(norm1(x));
  return torch::gelu(norm2(conv2(x)));
}

AirbenchNet::AirbenchNet(int64_t in_channels, int64_t num_classes, int64_t width_scale)
    : in_channels_(in_channels), num_classes_(num_classes) {
  const int64_t whiten_width = 2 * in_channels * kWhiteningKernel * kWhiteningKernel;
  whiten_ = register_module(
      "whiten", nn::Conv2d(nn::Conv2dOptions(in_channels, whiten_width, kWhiteningKernel).padding(0).bias(true)));
  // airbench builds the whitening layer with the same Conv class as the others, so it gets the same default
  // + dirac init and a zero bias; init_whitening() overwrites the weight before training.
  airbench_dirac_init_(whiten_);
  whiten_->weight.set_requires_grad(false);

  const int64_t base = 64 * width_scale;
  const std::vector<int64_t> widths = {base, 4 * base, 4 * base};
  auto layers = register_module("layers", nn::ModuleList());
  int64_t channels = whiten_width;
  for (int64_t width : widths) {
    groups_.push_back(AirbenchConvGroup(channels, width));
    layers->push_back(groups_.back());
    channels = width;
  }
  // LibTorch's default Linear init (kaiming-uniform), as airbench leaves nn.Linear.
  head_ = register_module("head", nn::Linear(nn::LinearOptions(channels, num_classes).bias(false)));
}

at::Tensor AirbenchNet::forward_impl(at::Tensor x) {
  if (x.dim() != 4 || x.size(1) != in_channels_ || x.size(2) < kMinImageSize || x.size(3) < kMinImageSize)
    throw ConfigError("airbench built for images [B, " + std::to_string(in_channels_) +
                          ", H, W] with H, W >= " + std::to_string(kMinImageSize) + ", got " + shape_string(x),
                      "build the model with the data's channels (make_airbench(in_channels, ...)); airbench is "
                      "meant for 32x32 images such as CIFAR-10");
  x = torch::gelu(whiten_(x));
  for (auto& group : groups_) x = group(x);
  // A max over the whole remaining map: for 32x32 inputs that map is 3x3 and this is airbench's MaxPool2d(3);
  // for other sizes it still gives one feature vector per image.
  x = std::get<0>(x.flatten(2).max(2));
  return head_(x) * kOutputScale;
}

void AirbenchNet::init_whitening(const at::Tensor& images) {
  const int64_t k = kWhiteningKernel;
  if (!images.defined() || images.dim() != 4 || images.size(0) == 0 || images.size(1) != in_channels_ ||
      images.size(2) < k || images.size(3) < k || !images.is_floating_point())
    throw ConfigError("airbench init_whitening needs float images [N, " + std::to_string(in_channels_) +
                          ", H, W] with N >= 1 and H, W >= 2, got " +
                          (images.defined() ? shape_string(images) + " " + std::string(images.dtype().name())
                                            : std::string("an undefined tensor")),
                      "pass normalized training images as float, e.g. the first 5000 of the training set");
  torch::NoGradGuard no_grad;
  const int64_t dim = in_channels_ * k * k;
  // Sum of outer products of every 2x2 patch, accumulated in float64 over chunks of images so the unfolded
  // patches (k*k times the images' size) never exist for the whole set at once.
  at::Tensor sum = torch::zeros({dim, dim}, images.options().dtype(torch::kDouble));
  int64_t count = 0;
  for (const at::Tensor& chunk : images.split(512)) {
    // [n, C, H, W] -> [n, C, H-1, W-1, k, k] -> [n, H-1, W-1, C, k, k] -> [patches, C*k*k]: each row is
    // flattened in the (C, kh, kw) order of a conv weight's row, so eigenvectors reshape into filters.
    const at::Tensor patches =
        chunk.to(torch::kFloat).unfold(2, k, 1).unfold(3, k, 1).permute({0, 2, 3, 1, 4, 5}).reshape({-1, dim});
    sum += patches.t().matmul(patches).to(torch::kDouble);
    count += patches.size(0);
  }
  // The eigendecomposition of a 12x12 matrix is cheap anywhere; doing it on the CPU in float64 avoids
  // depending on a GPU solver and keeps the result identical across ranks and devices.
  const at::Tensor second_moment = (sum / static_cast<double>(count)).cpu();
  at::Tensor eigenvalues, eigenvectors;  // ascending; eigenvectors are the columns
  // at::linalg_eigh, not torch::linalg::eigh: that C++ API header left torch/torch.h in 2.x and LibTorch
  // 2.14 no longer ships it; the ATen op is the same function in every version.
  std::tie(eigenvalues, eigenvectors) = at::linalg_eigh(second_moment, "U");
  // Largest variance first, as airbench orders them. Rounding can make a zero eigenvalue slightly negative;
  // clamping keeps the square root real for degenerate data (e.g. a constant channel).
  eigenvalues = eigenvalues.flip(0).clamp_min(0.0);
  eigenvectors = eigenvectors.flip(1);
  const at::Tensor filters =
      (eigenvectors.t() / (eigenvalues + kWhiteningEps).sqrt().unsqueeze(1)).reshape({dim, in_channels_, k, k});
  whiten_->weight.copy_(torch::cat({filters, -filters}, 0).to(whiten_->weight.options()));
}

std::vector<std::string> AirbenchNet::frozen_parameter_names() const {
  std::vector<std::string> names = {"whiten.weight"};
  for (size_t i = 0; i < groups_.size(); ++i) {
    names.push_back("layers." + std::to_string(i) + ".norm1.weight");
    names.push_back("layers." + std::to_string(i) + ".norm2.weight");
  }
  return names;
}

std::shared_ptr<Classifier> make_airbench(int64_t in_channels, int64_t num_classes, int64_t width_scale) {
  const auto check_positive = [](const char* what, int64_t value) {
    if (value <= 0)
      throw ConfigError(std::string("airbench ") + what + " must be positive, got " + std::to_string(value),
                        "airbench94 on CIFAR-10 is in_channels 3, num_classes 10, width_scale 1");
  };
  check_positive("in_channels", in_channels);
  check_positive("num_classes", num_classes);
  check_positive("width_scale", width_scale);
  return std::make_shared<AirbenchNet>(in_channels, num_classes, width_scale);
}

}  // namespace cohort::models

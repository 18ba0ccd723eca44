// Fashion-MNIST (and MNIST, which uses the same files) loaded whole into memory as uint8 images and
// int64 labels. The dataset is 47 MB, so every rank keeps a full copy and the DistributedSampler decides
// which samples it uses; make_batch (Batch.h) turns a list of indices into a normalized float batch.
//
//   cohort::data::ImageDataset train =
//       cohort::data::load_fashion_mnist(cohort::data::kDefaultFashionMnistRoot, /*train=*/true);
//   // train.images: uint8 [60000, 1, 28, 28]; train.labels: int64 [60000]; train.num_classes == 10
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace cohort::data {

// Where Debian's dataset-fashion-mnist package puts the files.
inline constexpr const char* kDefaultFashionMnistRoot = "/usr/share/datasets/fashion-mnist";
inline constexpr int64_t kFashionMnistClasses = 10;
// Per-pixel mean and standard deviation of the Fashion-MNIST training images, in [0, 1] units. MNIST
// files load too but would want 0.1307 / 0.3081; the files themselves cannot tell the two apart.
inline constexpr float kFashionMnistMean = 0.2860f;
inline constexpr float kFashionMnistStd = 0.3530f;
// MNIST's own statistics, for data.name=mnist (same file format).
inline constexpr float kMnistMean = 0.1307f;
inline constexpr float kMnistStd = 0.3081f;

// An image classification dataset held in memory. at::Tensor is torch::Tensor.
struct ImageDataset {
  at::Tensor images;  // uint8 [N, C, H, W], CPU, contiguous
  at::Tensor labels;  // int64 [N], CPU, contiguous, each in [0, num_classes)
  int64_t num_classes = 0;
  std::string name;
  // Normalization applied by make_batch: x -> (x / 255 - mean) / std, the same for every channel unless
  // per-channel values are given (CIFAR-10's RGB statistics).
  float mean = 0.0f;
  float std = 1.0f;
  std::vector<float> channel_mean, channel_std;
  float mean_of(int64_t c) const { return channel_mean.empty() ? mean : channel_mean[c]; }
  float std_of(int64_t c) const { return channel_std.empty() ? std : channel_std[c]; }

  int64_t size() const { return labels.defined() ? labels.size(0) : 0; }
};

// Loads the training split ({train}-images-idx3-ubyte, {train}-labels-idx1-ubyte) or the test split
// (t10k-...) from root; each file may or may not end in .gz. limit > 0 keeps only the first `limit`
// samples (for quick runs). Throws cohort::DataError when root or a file is missing, or when the files
// disagree with each other or with the format (see Idx.h).
ImageDataset load_fashion_mnist(const std::filesystem::path& root, bool train, int64_t limit = 0);

}  // namespace cohort::data

// data.device_resident: the dataset kept on the training device gives exactly the batches of the host
// path (in_memory / make_batch) for the same indices and augmentation, so turning it on changes no
// number. Here the device is the CPU (the gathers and lookups are the same tensor ops the GPU runs);
// scripts/gpu-check runs the trainer with it on CUDA.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/cuda.h>

#include "cohort/config/Config.h"
#include "cohort/data/DeviceResident.h"
#include "cohort/data/Source.h"
#include "cohort/util/Error.h"

using namespace cohort;
using cohort::data::AugmentOptions;
using cohort::data::ImageDataset;

namespace {

// Three channels with their own statistics (CIFAR-10's), 9x7 pixels, every value distinct from its
// neighbours and some 0, so padding, crops, flips and the per-channel tables are all told apart.
ImageDataset rgb_dataset(int64_t n) {
  ImageDataset ds;
  ds.images = at::empty({n, 3, 9, 7}, at::kByte);
  auto* p = ds.images.data_ptr<uint8_t>();
  for (int64_t i = 0; i < ds.images.numel(); ++i) p[i] = static_cast<uint8_t>((i * 37 + 11) % 256);
  ds.labels = at::arange(n, at::kLong).remainder(10);
  ds.num_classes = 10;
  ds.name = "rgb";
  ds.channel_mean = {0.4914f, 0.4822f, 0.4465f};
  ds.channel_std = {0.2470f, 0.2435f, 0.2616f};
  return ds;
}

void expect_same_batches(int64_t image_size, AugmentOptions aug) {
  auto host = data::in_memory(rgb_dataset(50), image_size);
  auto dev = data::device_resident(rgb_dataset(50), c10::Device(c10::kCPU), image_size);
  EXPECT_EQ(dev->size(), host->size());
  EXPECT_EQ(dev->image_size(), host->image_size());
  EXPECT_EQ(dev->channels(), 3);
  const std::vector<std::vector<int64_t>> batches = {{0, 1, 2, 3}, {49, 7, 7, 22, 13}, {31}};
  for (int64_t epoch : {0, 1, 2}) {
    aug.epoch = epoch;
    for (const auto& idx : batches) {
      const auto a = host->batch(idx, aug), b = dev->batch(idx, aug);
      ASSERT_EQ(a.images.sizes(), b.images.sizes());
      EXPECT_TRUE(a.images.equal(b.images))
          << "epoch " << epoch << ", max diff " << (a.images - b.images).abs().max().item<double>();
      EXPECT_TRUE(a.labels.equal(b.labels));
    }
  }
}

}  // namespace

TEST(DeviceResident, PlainBatchesAreTheHostPathsBitForBit) { expect_same_batches(0, AugmentOptions{}); }

TEST(DeviceResident, CropsAndRandomFlipsAreTheHostPathsBitForBit) {
  AugmentOptions aug;
  aug.enabled = true;
  aug.seed = 17;
  for (int64_t pad : {0, 2, 4}) {
    aug.crop_padding = pad;
    expect_same_batches(0, aug);
  }
}

TEST(DeviceResident, AlternatingFlipsAndAResizeAreTheHostPathsBitForBit) {
  AugmentOptions aug;
  aug.enabled = true;
  aug.crop_padding = 2;
  aug.alternating_flip = true;
  aug.seed = 3;
  expect_same_batches(0, aug);
  expect_same_batches(16, aug);  // the bilinear resize after augmentation, as in_memory's
}

TEST(DeviceResident, AugmentationActuallyMovesPixels) {
  // Guards the equality tests against two paths that both ignore augmentation.
  auto dev = data::device_resident(rgb_dataset(50), c10::Device(c10::kCPU));
  AugmentOptions aug;
  aug.enabled = true;
  aug.crop_padding = 2;
  const std::vector<int64_t> idx = {0, 1, 2, 3, 4, 5, 6, 7};
  EXPECT_FALSE(dev->batch(idx, aug).images.equal(dev->batch(idx, AugmentOptions{}).images));
}

// On the GPU machine (scripts/gpu-check runs these first): the same batches from CUDA, and pinned host
// batches from the loader.
TEST(DeviceResident, OnCudaTheBatchesAreTheHostPaths) {
  if (!torch::cuda::is_available()) {
    GTEST_SKIP() << "needs a CUDA device";
  }
  auto host = data::in_memory(rgb_dataset(50));
  auto dev = data::device_resident(rgb_dataset(50), c10::Device(c10::kCUDA, 0));
  AugmentOptions aug;
  aug.enabled = true;
  aug.crop_padding = 2;
  const std::vector<int64_t> idx = {3, 1, 49, 7, 7, 20};
  const auto a = host->batch(idx, aug), b = dev->batch(idx, aug);
  EXPECT_TRUE(b.images.is_cuda());
  EXPECT_TRUE(a.images.equal(b.images.cpu()));
  EXPECT_TRUE(a.labels.equal(b.labels.cpu()));
}

TEST(DeviceResident, CudaLoaderPinsHostBatches) {
  if (!torch::cuda::is_available()) {
    GTEST_SKIP() << "needs a CUDA device (pinned memory)";
  }
  auto host = data::in_memory(rgb_dataset(50));
  for (int64_t prefetch : {0, 2}) {
    data::Loader loader(*host, {{0, 1, 2}, {3, 4}}, AugmentOptions{}, prefetch, /*pin=*/true);
    while (auto b = loader.next()) {
      EXPECT_TRUE(b->images.is_pinned()) << "prefetch " << prefetch;
      EXPECT_TRUE(b->labels.is_pinned()) << "prefetch " << prefetch;
    }
  }
}

TEST(DeviceResident, ImagefolderIsRefusedWithTheReason) {
  try {
    config::load_from_string("", "test", {"data.name=imagefolder", "data.root=/tmp", "data.device_resident=true"});
    FAIL() << "imagefolder with data.device_resident was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("data.device_resident"), std::string::npos) << e.what();
  }
}

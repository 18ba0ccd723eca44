// train.device and train.channels_last on CPU: which device a worker gets, the named error for a GPU that
// is not there, and channels-last weights and images computing the same as the default layout.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "cohort/models/Models.h"
#include "cohort/train/Device.h"
#include "cohort/util/Error.h"

using namespace cohort;

TEST(TrainingDevice, CpuAndAutoOnAMachineWithoutGpusAndANamedErrorForCuda) {
  if (torch::cuda::is_available()) {
    GTEST_SKIP() << "a GPU is visible: the CPU-only answers do not apply";
  }
  EXPECT_TRUE(train::training_device("cpu", 0).is_cpu());
  EXPECT_TRUE(train::training_device("auto", 3).is_cpu());
  try {
    train::training_device("cuda", 0);
    ADD_FAILURE() << "train.device=cuda was accepted without a GPU";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("train.device=cuda"), std::string::npos) << e.what();
    EXPECT_FALSE(e.hint().empty());
  }
}

TEST(ChannelsLast, WeightsAndImagesComputeTheSameInNhwc) {
  ModelConfig mc;
  mc.name = "resnet8";
  mc.width = 8;
  torch::manual_seed(3);
  auto plain = models::build(mc, 3, 16);
  torch::manual_seed(3);
  auto nhwc = models::build(mc, 3, 16);
  train::to_channels_last(*nhwc);
  for (const auto& p : nhwc->named_parameters())
    if (p.value().dim() == 4) {
      EXPECT_TRUE(p.value().is_contiguous(at::MemoryFormat::ChannelsLast)) << p.key();
    }
  const auto x = torch::randn({4, 3, 16, 16});
  const auto x_nhwc = train::images_to(x, c10::Device(c10::kCPU), /*channels_last=*/true);
  EXPECT_TRUE(x_nhwc.is_contiguous(at::MemoryFormat::ChannelsLast));
  EXPECT_TRUE(x_nhwc.equal(x));  // same values, other memory order
  plain->eval();
  nhwc->eval();
  EXPECT_TRUE(at::allclose(nhwc->forward(x_nhwc), plain->forward(x), 1e-4, 1e-5));
}

// See Note [Channels-last strides, not just channels-last contiguity]: a one-channel model and batch
// (Fashion-MNIST's) get NHWC strides, which contiguous(ChannelsLast) alone leaves as NCHW, so the
// first convolution runs in NHWC and its output stays there.
TEST(ChannelsLast, OneChannelTensorsGetNhwcStridesSoConvolutionStaysNhwc) {
  const auto x = torch::randn({4, 1, 12, 12});
  ASSERT_TRUE(x.contiguous(at::MemoryFormat::ChannelsLast).strides().equals(x.strides()));  // the trap
  const auto x_nhwc = train::images_to(x, c10::Device(c10::kCPU), /*channels_last=*/true);
  EXPECT_EQ(x_nhwc.strides().vec(), (std::vector<int64_t>{144, 1, 12, 1}));
  EXPECT_TRUE(x_nhwc.equal(x));
  // Already NHWC-strided: no copy.
  EXPECT_EQ(train::with_channels_last_strides(x_nhwc).data_ptr(), x_nhwc.data_ptr());
  ModelConfig mc;
  mc.name = "resnet8";
  mc.width = 8;
  auto model = models::build(mc, 1, 12);
  train::to_channels_last(*model);
  for (const auto& p : model->named_parameters())
    if (p.value().dim() == 4) {
      EXPECT_EQ(p.value().strides().vec(), c10::get_channels_last_strides_2d(p.value().sizes())) << p.key();
    }
  auto conv = torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 8, 3).padding(1).bias(false));
  conv->weight.set_data(train::with_channels_last_strides(conv->weight));
  const auto y = conv->forward(x_nhwc);
  EXPECT_TRUE(y.is_contiguous(at::MemoryFormat::ChannelsLast));
  EXPECT_FALSE(y.is_contiguous());
}

// train.device and train.channels_last on CPU: which device a worker gets, the named error for a GPU that
// is not there, and channels-last weights and images computing the same as the default layout.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "cohort/models/Models.h"
#include "cohort/train/Device.h"
#include "cohort/util/Error.h"

using namespace cohort;

TEST(TrainingDevice, CpuAndAutoOnAMachineWithoutGpusAndANamedErrorForCuda) {
  if (torch::cuda::is_available()) GTEST_SKIP() << "a GPU is visible: the CPU-only answers do not apply";
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
    if (p.value().dim() == 4)
      EXPECT_TRUE(p.value().is_contiguous(at::MemoryFormat::ChannelsLast)) << p.key();
  const auto x = torch::randn({4, 3, 16, 16});
  const auto x_nhwc = train::images_to(x, c10::Device(c10::kCPU), /*channels_last=*/true);
  EXPECT_TRUE(x_nhwc.is_contiguous(at::MemoryFormat::ChannelsLast));
  EXPECT_TRUE(x_nhwc.equal(x));  // same values, other memory order
  plain->eval();
  nhwc->eval();
  EXPECT_TRUE(at::allclose(nhwc->forward(x_nhwc), plain->forward(x), 1e-4, 1e-5));
}

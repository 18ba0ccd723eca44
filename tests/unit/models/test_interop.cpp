// Fine-tuning from another model's weights: a checkpoint with another class count loads with a fresh head,
// and every other mismatch is named. Logits against torchvision and timm themselves, both ways, are the
// reference tests (tests/reference/models.py, `make test-reference`).
#include <gtest/gtest.h>

#include <filesystem>

#include <torch/torch.h>

#include "cohort/checkpoint/Checkpoint.h"
#include "cohort/checkpoint/Safetensors.h"
#include "cohort/models/Models.h"
#include "cohort/util/Error.h"

namespace ck = cohort::checkpoint;

TEST(Pretrained, AnotherClassCountGetsAFreshHeadEverythingElseMustMatch) {
  cohort::ModelConfig cfg;
  cfg.name = "resnet18";
  cfg.num_classes = 1000;
  auto imagenet = cohort::models::build(cfg, 3, 224);
  ck::NamedTensors state;
  for (const auto& p : imagenet->named_parameters()) state.emplace_back(p.key(), p.value());
  for (const auto& b : imagenet->named_buffers()) state.emplace_back(b.key(), b.value());
  cfg.num_classes = 10;
  auto cifar = cohort::models::build(cfg, 3, 224);
  const auto head_before = cifar->named_parameters()["fc.weight"].clone();
  const auto replaced = ck::load_weights(*cifar, state, "imagenet.safetensors", {"fc.weight", "fc.bias"});
  EXPECT_EQ(replaced, (std::vector<std::string>{"fc.weight", "fc.bias"}));
  EXPECT_TRUE(cifar->named_parameters()["fc.weight"].equal(head_before));  // kept its own initialization
  EXPECT_TRUE(cifar->named_parameters()["conv1.weight"].equal(imagenet->named_parameters()["conv1.weight"]));
  // Without the head allowance, or with a body that does not fit, the error names the tensors.
  try {
    ck::load_weights(*cifar, state, "imagenet.safetensors");
    FAIL() << "expected a mismatch";
  } catch (const cohort::CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("fc.weight (file [1000, 512], model [10, 512])"), std::string::npos)
        << e.what();
  }
  state.erase(state.begin());  // drop conv1.weight
  state.emplace_back("extra.weight", at::zeros({1}));
  try {
    ck::load_weights(*cifar, state, "imagenet.safetensors", {"fc.weight", "fc.bias"});
    FAIL() << "expected missing and unexpected tensors";
  } catch (const cohort::CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("missing: conv1.weight"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("unexpected: extra.weight"), std::string::npos) << e.what();
  }
}

// Model architectures by name: torchvision's parameter counts and names, and output shapes.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "cohort/checkpoint/Checkpoint.h"
#include "cohort/models/Models.h"

using namespace cohort;

namespace {
int64_t parameter_count(const torch::nn::Module& m) {
  int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.numel();
  return n;
}
ModelConfig named(const std::string& name, int64_t classes = 1000) {
  ModelConfig c;
  c.name = name;
  c.num_classes = classes;
  return c;
}
}  // namespace

TEST(Models, TorchvisionResNetsHaveTorchvisionSizesAndNames) {
  // torchvision's figures: resnet18 11,689,512 and resnet50 25,557,032 parameters; resnet50's
  // state_dict has 320 entries (FACTS.md).
  auto r18 = models::build(named("resnet18"), 3, 224);
  EXPECT_EQ(parameter_count(*r18), 11689512);
  auto r34 = models::build(named("resnet34"), 3, 224);
  EXPECT_EQ(parameter_count(*r34), 21797672);
  auto r50 = models::build(named("resnet50"), 3, 224);
  EXPECT_EQ(parameter_count(*r50), 25557032);
  const auto state = checkpoint::model_state(*r50);
  EXPECT_EQ(state.size(), 320u);
  std::set<std::string> names;
  for (const auto& [n, t] : state) names.insert(n);
  for (const char* n : {"conv1.weight", "bn1.running_var", "layer1.0.conv3.weight", "layer1.0.downsample.0.weight",
                        "layer4.2.bn3.num_batches_tracked", "fc.bias"})
    EXPECT_TRUE(names.count(n)) << n;
}

TEST(Models, EveryModelMapsImagesToLogits) {
  for (const char* name : {"resnet8", "resnet20", "resnet18", "resnet50", "mlp"}) {
    auto net = models::build(named(name, 10), 1, 28);
    net->eval();
    torch::NoGradGuard no_grad;
    auto out = net->forward(torch::randn({2, 1, 28, 28}));
    EXPECT_EQ(out.sizes(), (std::vector<int64_t>{2, 10})) << name;
  }
}

#include "cohort/models/Models.h"

#include <torch/torch.h>

#include <array>

#include "cohort/models/Airbench.h"
#include "cohort/models/Vit.h"
#include "cohort/util/Error.h"

namespace cohort::models {
namespace {

namespace nn = torch::nn;

nn::Conv2d conv3x3(int64_t in, int64_t out, int64_t stride) {
  return nn::Conv2d(nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false));
}

// torchvision's initialization: He-normal convolutions (fan-out), unit batch-norm scales, zero shifts.
void init_like_torchvision(nn::Module& model) {
  for (auto& m : model.modules(/*include_self=*/false)) {
    if (auto* c = m->as<nn::Conv2d>()) {
      nn::init::kaiming_normal_(c->weight, 0.0, torch::kFanOut, torch::kReLU);
    } else if (auto* bn = m->as<nn::BatchNorm2d>()) {
      nn::init::ones_(bn->weight);
      nn::init::zeros_(bn->bias);
    }
  }
}

// torchvision's BasicBlock, with its parameter names.
struct BasicBlockImpl : nn::Module {
  BasicBlockImpl(int64_t in, int64_t out, int64_t stride)
      : conv1(register_module("conv1", conv3x3(in, out, stride))),
        bn1(register_module("bn1", nn::BatchNorm2d(out))),
        conv2(register_module("conv2", conv3x3(out, out, 1))),
        bn2(register_module("bn2", nn::BatchNorm2d(out))) {
    if (stride != 1 || in != out) {
      downsample = register_module(
          "downsample",
          nn::Sequential(nn::Conv2d(nn::Conv2dOptions(in, out, 1).stride(stride).bias(false)), nn::BatchNorm2d(out)));
    }
  }
  at::Tensor forward(at::Tensor x) {
    auto out = torch::relu(bn1(conv1(x)));
    out = bn2(conv2(out));
    return torch::relu(out + (downsample ? downsample->forward(x) : x));
  }
  nn::Conv2d conv1;
  nn::BatchNorm2d bn1;
  nn::Conv2d conv2;
  nn::BatchNorm2d bn2;
  nn::Sequential downsample{nullptr};
};
TORCH_MODULE(BasicBlock);

// What both ResNet families share for FSDP: stages (layer1, layer2, ...) of blocks, run block by block
// (fsdp_unit=block) or stage by stage (fsdp_unit=child) through Classifier::run_unit.
class StagedResNet : public Classifier {
 protected:
  at::Tensor run_stages(at::Tensor x) {
    size_t unit = 0;
    for (auto& stage : layers) {
      if (!unit_per_block()) {
        x = run_unit(unit++, [&] { return stage->forward(x); });
        continue;
      }
      for (auto& block : *stage) x = run_unit(unit++, [&] { return block.forward(x); });
    }
    return x;
  }
  std::vector<std::string> unit_prefixes(const std::string& policy) override {
    std::vector<std::string> out;
    for (size_t s = 0; s < layers.size(); ++s) {
      const std::string stage = "layer" + std::to_string(s + 1) + ".";
      if (policy == "child")
        out.push_back(stage);
      else
        for (size_t b = 0; b < layers[s]->size(); ++b) out.push_back(stage + std::to_string(b) + ".");
    }
    return out;
  }
  std::vector<nn::Sequential> layers;
};

// The CIFAR-style ResNet (He et al. 2016, section 4.2): a 3x3 stem and three stages of basic blocks,
// widths w, 2w, 4w; depth 6n+2. Small images need no 7x7 stem or max-pool.
class SmallResNet : public StagedResNet {
 public:
  SmallResNet(int64_t in_channels, int64_t width, int64_t blocks_per_stage, int64_t num_classes)
      : conv1(register_module("conv1", conv3x3(in_channels, width, 1))),
        bn1(register_module("bn1", nn::BatchNorm2d(width))) {
    int64_t in = width;
    const int64_t widths[3] = {width, 2 * width, 4 * width};
    for (int s = 0; s < 3; ++s) {
      nn::Sequential stage;
      for (int64_t b = 0; b < blocks_per_stage; ++b) {
        stage->push_back(BasicBlock(in, widths[s], (b == 0 && s > 0) ? 2 : 1));
        in = widths[s];
      }
      layers.push_back(register_module("layer" + std::to_string(s + 1), stage));
    }
    fc = register_module("fc", nn::Linear(in, num_classes));
    init_like_torchvision(*this);
  }
  at::Tensor forward_impl(at::Tensor x) override {
    x = torch::relu(bn1(conv1(x)));
    x = run_stages(x);
    x = torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1);
    return fc(x);
  }

 private:
  nn::Conv2d conv1;
  nn::BatchNorm2d bn1;
  nn::Linear fc{nullptr};
};

// torchvision's Bottleneck (ResNet v1.5: the stride sits on the 3x3 conv), with its parameter names.
struct BottleneckImpl : nn::Module {
  static constexpr int64_t kExpansion = 4;
  BottleneckImpl(int64_t in, int64_t planes, int64_t stride)
      : conv1(register_module("conv1", nn::Conv2d(nn::Conv2dOptions(in, planes, 1).bias(false)))),
        bn1(register_module("bn1", nn::BatchNorm2d(planes))),
        conv2(register_module("conv2", conv3x3(planes, planes, stride))),
        bn2(register_module("bn2", nn::BatchNorm2d(planes))),
        conv3(register_module("conv3", nn::Conv2d(nn::Conv2dOptions(planes, planes * kExpansion, 1).bias(false)))),
        bn3(register_module("bn3", nn::BatchNorm2d(planes * kExpansion))) {
    if (stride != 1 || in != planes * kExpansion) {
      downsample = register_module(
          "downsample",
          nn::Sequential(nn::Conv2d(nn::Conv2dOptions(in, planes * kExpansion, 1).stride(stride).bias(false)),
                         nn::BatchNorm2d(planes * kExpansion)));
    }
  }
  at::Tensor forward(at::Tensor x) {
    auto out = torch::relu(bn1(conv1(x)));
    out = torch::relu(bn2(conv2(out)));
    out = bn3(conv3(out));
    return torch::relu(out + (downsample ? downsample->forward(x) : x));
  }
  nn::Conv2d conv1;
  nn::BatchNorm2d bn1;
  nn::Conv2d conv2;
  nn::BatchNorm2d bn2;
  nn::Conv2d conv3;
  nn::BatchNorm2d bn3;
  nn::Sequential downsample{nullptr};
};
TORCH_MODULE(Bottleneck);

// torchvision's ImageNet ResNets (resnet18/34/50): 7x7 stride-2 stem, max-pool, four stages of widths
// 64..512, global average pool, fc. Same architecture, names and initialization, so torchvision
// weights exported to safetensors load by name.
class TorchvisionResNet : public StagedResNet {
 public:
  TorchvisionResNet(int64_t in_channels, bool bottleneck, std::array<int64_t, 4> blocks, int64_t num_classes)
      : conv1(register_module("conv1",
                              nn::Conv2d(nn::Conv2dOptions(in_channels, 64, 7).stride(2).padding(3).bias(false)))),
        bn1(register_module("bn1", nn::BatchNorm2d(64))) {
    int64_t in = 64;
    for (int s = 0; s < 4; ++s) {
      const int64_t planes = 64 << s;
      nn::Sequential stage;
      for (int64_t b = 0; b < blocks[s]; ++b) {
        const int64_t stride = (b == 0 && s > 0) ? 2 : 1;
        if (bottleneck) {
          stage->push_back(Bottleneck(in, planes, stride));
          in = planes * BottleneckImpl::kExpansion;
        } else {
          stage->push_back(BasicBlock(in, planes, stride));
          in = planes;
        }
      }
      layers.push_back(register_module("layer" + std::to_string(s + 1), stage));
    }
    fc = register_module("fc", nn::Linear(in, num_classes));
    init_like_torchvision(*this);
  }
  at::Tensor forward_impl(at::Tensor x) override {
    x = torch::relu(bn1(conv1(x)));
    x = torch::max_pool2d(x, 3, 2, 1);
    x = run_stages(x);
    x = torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1);
    return fc(x);
  }

 private:
  nn::Conv2d conv1;
  nn::BatchNorm2d bn1;
  nn::Linear fc{nullptr};
};

class Mlp : public Classifier {
 public:
  Mlp(int64_t inputs, int64_t hidden, int64_t num_classes)
      : fc1(register_module("fc1", nn::Linear(inputs, hidden))),
        fc2(register_module("fc2", nn::Linear(hidden, hidden))),
        fc(register_module("fc", nn::Linear(hidden, num_classes))) {}
  at::Tensor forward_impl(at::Tensor x) override {
    x = torch::relu(fc1(x.flatten(1)));
    x = torch::relu(fc2(x));
    return fc(x);
  }

 private:
  nn::Linear fc1, fc2, fc;
};

}  // namespace

std::shared_ptr<Classifier> build(const ModelConfig& cfg, int64_t in_channels, int64_t image_size) {
  if (cfg.name == "mlp")
    return std::make_shared<Mlp>(in_channels * image_size * image_size, cfg.width, cfg.num_classes);
  const std::pair<const char*, int64_t> resnets[] = {{"resnet8", 1}, {"resnet14", 2}, {"resnet20", 3}, {"resnet32", 5}};
  for (const auto& [name, blocks] : resnets)
    if (cfg.name == name) return std::make_shared<SmallResNet>(in_channels, cfg.width, blocks, cfg.num_classes);
  if (cfg.name == "resnet18")
    return std::make_shared<TorchvisionResNet>(in_channels, false, std::array<int64_t, 4>{2, 2, 2, 2}, cfg.num_classes);
  if (cfg.name == "resnet34")
    return std::make_shared<TorchvisionResNet>(in_channels, false, std::array<int64_t, 4>{3, 4, 6, 3}, cfg.num_classes);
  if (cfg.name == "resnet50")
    return std::make_shared<TorchvisionResNet>(in_channels, true, std::array<int64_t, 4>{3, 4, 6, 3}, cfg.num_classes);
  if (cfg.name == "vit_b32") return make_vit_b32(in_channels, image_size, cfg.num_classes);
  if (cfg.name == "airbench") return make_airbench(in_channels, cfg.num_classes, /*width_scale=*/1);
  throw ConfigError(
      "config key 'model.name': unknown model '" + cfg.name + "'",
      "use one of resnet8, resnet14, resnet20, resnet32, resnet18, resnet34, resnet50, vit_b32, airbench, mlp");
}

}  // namespace cohort::models

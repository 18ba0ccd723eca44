// Bytes each rank all-reduces per step under each dist.compress setting, for the Fashion-MNIST ResNet
// (resnet8, width 32), ResNet-18 and ResNet-50. Computed from the same pure plans the reducer and the
// PowerSGD hook use at run time (bucket plan with 25 MiB buckets, per-matrix PowerSGD plan), so the
// figures are what a run sends once compression has started; bench/slow_network.py measures a real run.
// Prints JSON. Run: build/bench/compress_bytes > bench/results/compress_bytes.json
#include <iostream>

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "cohort/models/Models.h"
#include "cohort/parallel/BucketPlan.h"
#include "cohort/parallel/compress/PowerSgd.h"

using namespace cohort;

int main() {
  struct Case {
    const char* label;
    const char* model;
    int64_t width, channels, image;
  };
  const Case cases[] = {{"fashion-mnist resnet8 w32", "resnet8", 32, 1, 28},
                        {"resnet18 (ImageNet, 1000 classes)", "resnet18", 64, 3, 224},
                        {"resnet50 (ImageNet, 1000 classes)", "resnet50", 64, 3, 224}};
  nlohmann::json out = nlohmann::json::array();
  for (const auto& c : cases) {
    ModelConfig mc;
    mc.name = c.model;
    mc.width = c.width;
    mc.num_classes = c.model == std::string("resnet8") ? 10 : 1000;
    auto net = models::build(mc, c.channels, c.image);
    std::vector<at::Tensor> params;
    std::vector<parallel::ParamSpec> specs;
    for (const auto& p : net->parameters()) {
      params.push_back(p);
      specs.push_back({"", p.sizes().vec(), p.scalar_type()});
    }
    const auto buckets = parallel::plan_buckets(specs, 25ll << 20, 1ll << 20);
    int64_t dense = 0;
    for (const auto& b : buckets) dense += b.numel * 4;
    nlohmann::json row = {{"model", c.label},    {"parameters", dense / 4}, {"buckets", buckets.size()},
                          {"none_bytes", dense}, {"fp16_bytes", dense / 2}, {"fp16_ratio", 2.0}};
    for (int64_t rank : {1, 2, 4}) {
      parallel::compress::PowerSgdOptions o;
      o.rank = rank;
      int64_t sent = 0;
      for (const auto& b : buckets) {
        std::vector<std::vector<int64_t>> shapes;
        for (size_t i : b.params) shapes.push_back(params[i].sizes().vec());
        sent += parallel::compress::compressed_numel(parallel::compress::plan_matrices(shapes, o)) * 4;
      }
      const std::string key = "powersgd_rank" + std::to_string(rank);
      row[key + "_bytes"] = sent;
      row[key + "_ratio"] = static_cast<double>(dense) / static_cast<double>(sent);
    }
    out.push_back(row);
  }
  std::cout << nlohmann::json{{"bench", "compress_bytes"}, {"per_step_per_rank", out}}.dump(2) << std::endl;
  return 0;
}

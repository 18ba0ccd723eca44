// The optimizer step alone, per-parameter loop against multi-tensor (optim.foreach), on the models cohort
// trains: what decides optim.foreach=auto (Note [One call per operation per group] in optim/Sgd.cpp).
// Both optimizers step identical copies of a model's parameters with the same random gradients; they run
// in alternating blocks of --steps steps, --rounds times, and the medians per step are compared. Prints
// one JSON object per model and optimizer, then a summary object.
//
//   build/bench/optimizer_step --models resnet8,resnet18,resnet50,vit_b32 --optims sgd,adamw
//   build-gpu/bench/optimizer_step --device cuda --models resnet50
#include <algorithm>
#include <chrono>
#include <iostream>
#include <sstream>
#include <string>

#include <torch/torch.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cohort/models/Models.h"
#include "cohort/optim/Sgd.h"
#include "cohort/train/Device.h"

#if COHORT_HAVE_CUDA
#include <torch/cuda.h>
#endif

namespace {

using Clock = std::chrono::steady_clock;

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

void sync(const c10::Device& d) {
#if COHORT_HAVE_CUDA
  if (d.is_cuda()) torch::cuda::synchronize(d.index());
#else
  (void)d;
#endif
}

// The model's parameters in the groups cohort trains them with (decay on weights, none on norms and biases),
// copied so that two optimizers never share a tensor; each has a gradient.
std::vector<cohort::optim::ParamGroup> groups_of(const cohort::models::Classifier& model, const c10::Device& device) {
  torch::OrderedDict<std::string, at::Tensor> named;
  for (const auto& item : model.named_parameters()) {
    auto p = item.value().detach().to(device).clone().requires_grad_(true);
    p.mutable_grad() = torch::randn_like(p) * 1e-2;
    named.insert(item.key(), p);
  }
  return cohort::optim::split_decay(named, 5e-4, false);
}

std::unique_ptr<cohort::optim::Optimizer> make(const std::string& name, bool foreach,
                                               std::vector<cohort::optim::ParamGroup> groups) {
  cohort::OptimConfig cfg;
  cfg.name = name;
  cfg.foreach = foreach ? "true" : "false";
  return cohort::optim::make_optimizer(cfg, std::move(groups));
}

double seconds_per_step(cohort::optim::Optimizer& opt, int64_t steps, const c10::Device& device) {
  sync(device);
  const auto t0 = Clock::now();
  for (int64_t s = 0; s < steps; ++s) opt.step(1e-3);
  sync(device);
  return std::chrono::duration<double>(Clock::now() - t0).count() / static_cast<double>(steps);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string models = "resnet8,resnet18,resnet50,vit_b32", optims = "sgd,adamw", device_name = "cpu";
  int64_t steps = 20, rounds = 5, image = 0, threads = 0;
  CLI::App app{"the optimizer step: per-parameter loop against multi-tensor updates"};
  app.add_option("--models", models, "comma list of cohort model names");
  app.add_option("--optims", optims, "comma list of sgd, adamw");
  app.add_option("--steps", steps, "steps per timed block");
  app.add_option("--rounds", rounds, "blocks per implementation (alternating)");
  app.add_option("--image", image, "image size the models are built for (default: 28, vit_b32 224)");
  app.add_option("--threads", threads, "intra-op threads (default: LibTorch's)");
  app.add_option("--device", device_name)->check(CLI::IsMember({"cpu", "cuda"}));
  CLI11_PARSE(app, argc, argv);
  if (threads > 0) at::set_num_threads(static_cast<int>(threads));
  const c10::Device device = cohort::train::training_device(device_name, 0);
  nlohmann::json summary = {{"bench", "optimizer_step"},
                            {"device", device.str()},
                            {"threads", at::get_num_threads()},
                            {"torch", std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR)},
                            {"steps", steps},
                            {"rounds", rounds},
                            {"results", nlohmann::json::array()}};
  for (const auto& model_name : split(models)) {
    cohort::ModelConfig mc;
    mc.name = model_name;
    mc.num_classes = model_name == "vit_b32" || model_name.rfind("resnet", 0) == 0 ? 1000 : 10;
    if (model_name == "resnet8") mc.num_classes = 10;
    const int64_t size = image ? image : (model_name == "vit_b32" ? 224 : 28);
    torch::manual_seed(0);
    auto model = cohort::models::build(mc, model_name == "mlp" ? 1 : 3, size);
    for (const auto& optim : split(optims)) {
      auto loop = make(optim, false, groups_of(*model, device));
      auto multi = make(optim, true, groups_of(*model, device));
      int64_t tensors = 0, elements = 0;
      for (const auto& g : loop->groups())
        for (const auto& p : g.params) {
          ++tensors;
          elements += p.numel();
        }
      seconds_per_step(*loop, 2, device);  // first steps allocate state
      seconds_per_step(*multi, 2, device);
      std::vector<double> t_loop, t_multi;
      for (int64_t r = 0; r < rounds; ++r) {
        if (r % 2 == 0) {
          t_loop.push_back(seconds_per_step(*loop, steps, device));
          t_multi.push_back(seconds_per_step(*multi, steps, device));
        } else {
          t_multi.push_back(seconds_per_step(*multi, steps, device));
          t_loop.push_back(seconds_per_step(*loop, steps, device));
        }
      }
      const double l = median(t_loop), m = median(t_multi);
      nlohmann::json row = {{"model", model_name},        {"optim", optim},           {"tensors", tensors},
                            {"elements", elements},       {"loop_ms", 1e3 * l},       {"foreach_ms", 1e3 * m},
                            {"foreach_over_loop", m / l}, {"loop_rounds_ms", t_loop}, {"foreach_rounds_ms", t_multi}};
      for (auto* key : {"loop_rounds_ms", "foreach_rounds_ms"})
        for (auto& v : row[key]) v = 1e3 * v.get<double>();
      std::cout << row.dump() << std::endl;
      summary["results"].push_back(row);
    }
  }
  std::cout << summary.dump() << std::endl;
  return 0;
}

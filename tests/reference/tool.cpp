// What the reference tests (tests/reference/*.py) ask of cohort's library directly:
//
//   cohort_reference_tool sampler < cases.jsonl
//       for each line {"n", "world", "seed", "epoch", "shuffle", "drop_last"}: one line, every rank's
//       DistributedSampler indices for that epoch, [[rank 0's], [rank 1's], ...]
//   cohort_reference_tool safetensors-copy IN OUT
//       IN read by cohort's safetensors reader and written again by its writer, metadata included
//   cohort_reference_tool optim IN OUT N STEPS_PER_EPOCH EMA_DECAY [key=value ...]
//       N steps of cohort's optimizer and schedule (optim.*, sched.* keys; peak lr optim.lr, N total steps)
//       from IN's parameters "p.<name>" with the gradients "g<step>.<name>", parameter groups as the
//       trainer makes them; an EMA of decay EMA_DECAY updated after each step. OUT holds the final
//       "p.<name>", "ema.<name>" and "lr" (the learning rate of each step).
//   cohort_reference_tool loss IN OUT [key=value ...]
//       the trainer's loss (loss.* keys) of IN's "logits" against its "labels" (int64), and its gradient
//       with respect to the logits: OUT holds "loss" and "grad"
//   cohort_reference_tool preprocess OUT FILE... [key=value ...]
//       `cohort predict`'s evaluation transform of each JPEG FILE for the config's model and data, stacked
//       into the tensor "images" of OUT (safetensors)
//   cohort_reference_tool flops BATCH IMAGE_SIZE IN_CHANNELS [key=value ...]
//       the FLOPs cohort counts (models/Flops.h) for the config's model in training mode on a random
//       batch: one JSON line {"forward", "backward", "by_op"}
#include <cstdlib>
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include <torch/torch.h>

#include "cohort/checkpoint/Safetensors.h"
#include "cohort/commands/Predict.h"
#include "cohort/config/Config.h"
#include "cohort/data/DistributedSampler.h"
#include "cohort/models/Flops.h"
#include "cohort/models/Loss.h"
#include "cohort/models/Models.h"
#include "cohort/optim/Ema.h"
#include "cohort/optim/Optimizer.h"
#include "cohort/optim/Schedule.h"
#include "cohort/parallel/Strategy.h"

namespace {

int sampler() {
  std::string line;
  while (std::getline(std::cin, line)) {
    const auto c = nlohmann::json::parse(line);
    nlohmann::json ranks = nlohmann::json::array();
    for (int r = 0; r < c.at("world").get<int>(); ++r) {
      const cohort::data::DistributedSampler s(c.at("n").get<int64_t>(), c.at("world").get<int>(), r,
                                               c.at("shuffle").get<bool>(), c.at("seed").get<uint64_t>(),
                                               c.at("drop_last").get<bool>());
      ranks.push_back(s.indices(c.at("epoch").get<int64_t>()));
    }
    std::cout << ranks.dump() << "\n";
  }
  return 0;
}

int safetensors_copy(const std::string& in, const std::string& out) {
  const auto f = cohort::checkpoint::load_safetensors(in);
  cohort::checkpoint::save_safetensors(out, f.tensors, f.metadata);
  return 0;
}

int optim_steps(const std::string& in, const std::string& out, int64_t steps, int64_t per_epoch, double ema_decay,
                const std::vector<std::string>& overrides) {
  const auto cfg = cohort::config::load(std::nullopt, overrides);
  const auto file = cohort::checkpoint::load_safetensors(in);
  // A module holding the parameters by name (names without dots), for the groups and the EMA.
  torch::nn::Module module;
  for (const auto& [name, t] : file.tensors)
    if (name.rfind("p.", 0) == 0) module.register_parameter(name.substr(2), t.clone());
  auto opt = cohort::optim::make_optimizer(
      cfg.optim, cohort::optim::split_groups(module.named_parameters(), cohort::parallel::group_rule(cfg.optim)));
  const cohort::optim::Schedule schedule(cfg.sched, cfg.optim.lr, steps, per_epoch);
  cohort::optim::Ema ema(module, ema_decay);
  auto lrs = torch::empty({steps}, torch::kFloat64);
  for (int64_t s = 0; s < steps; ++s) {
    for (auto& p : module.named_parameters())
      for (const auto& [name, g] : file.tensors)
        if (name == "g" + std::to_string(s) + "." + p.key()) p.value().mutable_grad() = g.clone();
    lrs[s] = schedule.lr(s);
    opt->set_momentum(schedule.momentum(s));
    opt->step(schedule.lr(s));
    ema.update(module);
  }
  cohort::checkpoint::NamedTensors result{{"lr", lrs}};
  for (const auto& p : module.named_parameters()) result.emplace_back("p." + p.key(), p.value().detach());
  for (const auto& [name, t] : ema.state_dict()) result.emplace_back("ema." + name, t);
  cohort::checkpoint::save_safetensors(out, result);
  return 0;
}

int loss_and_grad(const std::string& in, const std::string& out, const std::vector<std::string>& overrides) {
  const auto cfg = cohort::config::load(std::nullopt, overrides);
  const auto file = cohort::checkpoint::load_safetensors(in);
  at::Tensor logits, labels;
  for (const auto& [name, t] : file.tensors) {
    if (name == "logits") logits = t.clone().requires_grad_(true);
    if (name == "labels") labels = t;
  }
  if (!logits.defined() || !labels.defined()) throw std::runtime_error(in + " needs tensors logits and labels");
  auto loss = cohort::models::training_loss(logits, labels, cfg.loss);
  loss.backward();
  cohort::checkpoint::save_safetensors(out, {{"loss", loss.detach()}, {"grad", logits.grad()}});
  return 0;
}

int preprocess(const std::string& out, int n, char** words) {
  std::vector<std::string> overrides;
  std::vector<at::Tensor> images;
  for (int i = 0; i < n; ++i)
    if (std::string(words[i]).find('=') != std::string::npos) overrides.push_back(words[i]);
  const auto cfg = cohort::config::load(std::nullopt, overrides);
  for (int i = 0; i < n; ++i)
    if (std::string(words[i]).find('=') == std::string::npos)
      images.push_back(cohort::commands::preprocess_image(cfg, words[i]));
  cohort::checkpoint::save_safetensors(out, {{"images", torch::stack(images)}});
  return 0;
}

int flops(int64_t batch, int64_t image_size, int64_t in_channels, const std::vector<std::string>& overrides) {
  const auto cfg = cohort::config::load(std::nullopt, overrides);
  torch::manual_seed(0);
  auto model = cohort::models::build(cfg.model, in_channels, image_size);
  model->train();
  const auto images = torch::randn({batch, in_channels, image_size, image_size});
  nlohmann::json out;
  at::Tensor loss;
  {
    cohort::models::FlopCounter count;
    loss = model->forward(images).sum();
    out["forward"] = count.total();
    out["by_op"]["forward"] = count.by_op();
  }
  {
    cohort::models::FlopCounter count;
    loss.backward();
    out["backward"] = count.total();
    out["by_op"]["backward"] = count.by_op();
  }
  std::cout << out.dump() << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string what = argc > 1 ? argv[1] : "";
  try {
    if (what == "sampler" && argc == 2) return sampler();
    if (what == "safetensors-copy" && argc == 4) return safetensors_copy(argv[2], argv[3]);
    if (what == "preprocess" && argc >= 4) return preprocess(argv[2], argc - 3, argv + 3);
    if (what == "loss" && argc >= 4)
      return loss_and_grad(argv[2], argv[3], std::vector<std::string>(argv + 4, argv + argc));
    if (what == "flops" && argc >= 5)
      return flops(std::stoll(argv[2]), std::stoll(argv[3]), std::stoll(argv[4]),
                   std::vector<std::string>(argv + 5, argv + argc));
    if (what == "optim" && argc >= 7)
      return optim_steps(argv[2], argv[3], std::stoll(argv[4]), std::stoll(argv[5]), std::stod(argv[6]),
                         std::vector<std::string>(argv + 7, argv + argc));
  } catch (const std::exception& e) {
    std::cerr << "cohort_reference_tool: " << e.what() << "\n";
    return 1;
  }
  std::cerr << "usage: cohort_reference_tool sampler < cases.jsonl\n"
               "       cohort_reference_tool safetensors-copy IN OUT\n"
               "       cohort_reference_tool loss IN OUT [key=value ...]\n"
               "       cohort_reference_tool preprocess OUT FILE... [key=value ...]\n"
               "       cohort_reference_tool flops BATCH IMAGE_SIZE IN_CHANNELS [key=value ...]\n"
               "       cohort_reference_tool optim IN OUT N STEPS_PER_EPOCH EMA_DECAY [key=value ...]\n";
  return 2;
}

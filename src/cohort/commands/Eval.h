// `cohort eval`'s worker: a checkpoint's weights on the test set across ranks, in fp32, with the setup
// training uses (train/Setup.h).
//
//   const auto r = cohort::commands::run_eval_worker(cfg, info, "runs/x/checkpoints/best.safetensors", "eval.json");
//   std::cout << r.top1;   // rank 0 has also printed it, and written it as JSON to eval.json
#pragma once

#include <cstdint>
#include <filesystem>

#include "cohort/comm/WorldInfo.h"
#include "cohort/config/Config.h"

namespace cohort::commands {

// `cohort eval`: the model of `cfg` with the weights in `checkpoint` (a .safetensors of the model, strict
// names and shapes), evaluated on the validation split, every rank taking its share of the samples.
// Rank 0 prints the result and writes it as JSON to `out` when given.
struct EvalResult {
  double loss = 0, top1 = 0, top5 = 0;
  int64_t images = 0;
};
EvalResult run_eval_worker(const TrainConfig& cfg, const comm::WorldInfo& info, const std::filesystem::path& checkpoint,
                           const std::filesystem::path& out);

}  // namespace cohort::commands

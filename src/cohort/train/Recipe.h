// A model's training recipe around the step, beyond its optimizer: airbench's whitening bias, trained for
// the first train.whiten_bias_epochs only, and its lookahead (train.lookahead): every 5 steps the weights
// are pulled to their moving average, with a decay that reaches 1 at the run's last step. The config says
// which parts are on; the loop calls the recipe when an epoch starts and after each applied step, so the
// loop names no model's tricks.
//
//   train::Recipe recipe(cfg, *job.model, *job.strategy, job.lookahead.get(), plan.total_steps);
//   recipe.epoch_started(epoch);  // freezes what trains for the first epochs only
//   ... a step ...
//   recipe.step_done(step);       // the lookahead pull, every 5 steps and at the end
#pragma once

#include <cstdint>

#include <torch/nn/module.h>

#include "cohort/config/Config.h"
#include "cohort/optim/Ema.h"
#include "cohort/parallel/Strategy.h"

namespace cohort::train {

class Recipe {
 public:
  // `lookahead`: the average train.lookahead keeps (the checkpoint saves it too), or null.
  Recipe(const TrainConfig& cfg, torch::nn::Module& model, parallel::Strategy& strategy, optim::Ema* lookahead,
         int64_t total_steps);

  // Before epoch `epoch`'s first step, a resumed run's included.
  void epoch_started(int64_t epoch);
  // After the update that made `step` steps (counted from 1).
  void step_done(int64_t step);

 private:
  int64_t whiten_bias_epochs_;
  torch::nn::Module& model_;
  parallel::Strategy& strategy_;
  optim::Ema* lookahead_;
  int64_t total_steps_;
};

}  // namespace cohort::train

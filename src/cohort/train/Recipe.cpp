#include "cohort/train/Recipe.h"

namespace cohort::train {

Recipe::Recipe(const TrainConfig& cfg, torch::nn::Module& model, parallel::Strategy& strategy, optim::Ema* lookahead,
               int64_t total_steps)
    : whiten_bias_epochs_(cfg.train.whiten_bias_epochs),
      model_(model),
      strategy_(strategy),
      lookahead_(lookahead),
      total_steps_(total_steps) {}

void Recipe::epoch_started(int64_t epoch) {
  // The strategy freezes it: under zero and fsdp its slices and optimizer state are the strategy's.
  if (whiten_bias_epochs_ > 0 && epoch >= whiten_bias_epochs_) strategy_.freeze("whiten.bias");
}

void Recipe::step_done(int64_t step) {
  if (!lookahead_) return;
  if (step % 5 == 0) lookahead_->lookahead(model_, optim::airbench_lookahead_decay(step, total_steps_));
  // The run ends on the average itself (decay 1: the weights become the average).
  if (step == total_steps_) lookahead_->lookahead(model_, 1.0);
}

}  // namespace cohort::train

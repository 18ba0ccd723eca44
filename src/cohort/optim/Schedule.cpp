#include "cohort/optim/Schedule.h"

#include <algorithm>
#include <cmath>

namespace cohort::optim {
namespace {

double cos_anneal(double start, double end, double pct) {
  return end + (start - end) / 2.0 * (std::cos(M_PI * pct) + 1.0);
}

}  // namespace

Schedule::Schedule(const SchedConfig& cfg, double peak_lr, int64_t total_steps, int64_t steps_per_epoch)
    : cfg_(cfg),
      peak_(peak_lr),
      total_(std::max<int64_t>(total_steps, 1)),
      per_epoch_(std::max<int64_t>(steps_per_epoch, 1)),
      warmup_steps_(cfg.name == "onecycle" ? 0
                                           : static_cast<int64_t>(std::llround(cfg.warmup_epochs * steps_per_epoch))) {}

// OneCycleLR's two phases: from `start` to `turn` until step pct_start * total - 1, then to `end` at
// step total - 1, each a cosine.
double Schedule::one_cycle(int64_t step, double start, double turn, double end) const {
  const double up_end = cfg_.pct_start * static_cast<double>(total_) - 1.0;
  const double down_end = static_cast<double>(total_) - 1.0;
  const double s = static_cast<double>(std::min(step, total_ - 1));
  if (s <= up_end) return cos_anneal(start, turn, up_end > 0 ? s / up_end : 1.0);
  return cos_anneal(turn, end, (s - up_end) / std::max(down_end - up_end, 1.0));
}

double Schedule::momentum(int64_t step) const {
  if (cfg_.name != "onecycle" || !cfg_.cycle_momentum) return -1;
  return one_cycle(step, cfg_.max_momentum, cfg_.base_momentum, cfg_.max_momentum);
}

double Schedule::lr(int64_t step) const {
  if (cfg_.name == "onecycle") {
    const double initial = peak_ / cfg_.div_factor;
    return one_cycle(step, initial, peak_, initial / cfg_.final_div_factor);
  }
  if (step < warmup_steps_) {
    const double f = cfg_.warmup_start_factor + (1.0 - cfg_.warmup_start_factor) * step / warmup_steps_;
    return peak_ * f;
  }
  if (cfg_.name == "cosine") {
    const double span = std::max<double>(total_ - warmup_steps_, 1);
    const double pct = std::min(1.0, (step - warmup_steps_) / span);
    return cos_anneal(peak_, peak_ * cfg_.min_lr_factor, pct);
  }
  if (cfg_.name == "step") {
    const double epoch = static_cast<double>(step) / per_epoch_;
    return peak_ * std::pow(cfg_.gamma, std::floor(epoch / cfg_.step_epochs));
  }
  return peak_;  // constant
}

}  // namespace cohort::optim

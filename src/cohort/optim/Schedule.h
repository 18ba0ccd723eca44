// Learning-rate schedules as pure functions of the step, so resuming needs only the step number.
//
//   cohort::optim::Schedule sched(cfg.sched, /*peak_lr=*/0.2, /*total_steps=*/1404, /*steps_per_epoch=*/468);
//   double lr = sched.lr(step);
//   optimizer.set_momentum(sched.momentum(step));   // -1 when not cycling: the optimizer keeps its own
//
// onecycle follows torch.optim.lr_scheduler.OneCycleLR (cosine, two phases, and by default its momentum
// cycle); cosine, step and constant start with an optional linear warmup from peak x
// sched.warmup_start_factor.
#pragma once

#include <cstdint>

#include "cohort/config/Config.h"

namespace cohort::optim {

class Schedule {
 public:
  Schedule(const SchedConfig& cfg, double peak_lr, int64_t total_steps, int64_t steps_per_epoch);
  double lr(int64_t step) const;
  // onecycle with sched.cycle_momentum: this step's momentum (SGD) or beta1 (AdamW), which falls from
  // max_momentum to base_momentum while the lr rises and comes back while it falls. Otherwise -1: the
  // optimizer keeps its own.
  double momentum(int64_t step) const;

 private:
  double one_cycle(int64_t step, double start, double turn, double end) const;

  SchedConfig cfg_;
  double peak_;
  int64_t total_;
  int64_t per_epoch_;
  int64_t warmup_steps_;
};

}  // namespace cohort::optim

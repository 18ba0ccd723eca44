// Dynamic loss scaling for fp16 training, with torch.cuda.amp.GradScaler's rule: multiply the loss by
// the scale before backward so small gradients survive fp16, divide the gradients by it before the
// update, skip the update and halve the scale when any gradient overflowed, and double the scale after
// `growth_interval` clean steps in a row.
//
//   cohort::amp::GradScaler scaler(cfg.amp, /*enabled=*/true);   // amp.init_scale, growth_interval...
//   scaler.scale(loss).backward();
//   const bool overflow = cohort::amp::unscale_and_check(grads, 1.0 / scaler.scale());  // then agree across ranks
//   if (!overflow_anywhere) optimizer.step();
//   scaler.update(overflow_anywhere);
//
// The scale lives on the host: the decision to skip has to reach the host anyway (every rank must skip
// together, which takes a collective), so PyTorch's device-resident scale would save nothing here.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/ATen.h>

#include "cohort/config/Config.h"

namespace cohort::amp {

// What a checkpoint keeps so a resumed run continues with the same scale.
struct ScalerState {
  double scale = 1.0;
  int64_t growth_tracker = 0;  // clean steps since the scale last changed
  int64_t skipped_steps = 0;   // updates skipped for overflow, over the whole run
};

class GradScaler {
 public:
  // The rule's constants come from amp.* (init_scale, growth_interval, growth_factor, backoff_factor).
  // Disabled, the scale is 1 and update() does nothing.
  GradScaler(const AmpConfig& cfg, bool enabled);

  bool enabled() const { return enabled_; }
  // 1 when disabled, so callers can divide by it unconditionally.
  double scale() const { return enabled() ? state_.scale : 1.0; }
  // loss x scale (the loss itself when disabled).
  at::Tensor scale(const at::Tensor& loss) const;
  // After a step: `found_inf` must be the same on every rank. Returns true when the scale changed.
  bool update(bool found_inf);

  const ScalerState& state() const { return state_; }
  void load_state(const ScalerState& s);

 private:
  AmpConfig cfg_;
  bool enabled_;
  ScalerState state_;
};

// Multiplies every gradient by `inv_scale` in place and says whether any element of any of them is inf or
// NaN (this rank's gradients only). On CUDA it uses PyTorch's fused _amp_foreach_non_finite_check_and_unscale_;
// elsewhere ordinary tensor ops, because LibTorch 1.13 has no CPU kernel for it (FACTS.md).
bool unscale_and_check(const std::vector<at::Tensor>& grads, double inv_scale);

}  // namespace cohort::amp

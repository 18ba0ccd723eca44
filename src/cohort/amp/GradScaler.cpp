#include "cohort/amp/GradScaler.h"

#include <cmath>
#include <map>
#include <tuple>

#include "cohort/util/Error.h"
#include "cohort/util/TorchCompat.h"

namespace cohort::amp {

GradScaler::GradScaler(const AmpConfig& cfg, bool enabled) : cfg_(cfg), enabled_(enabled) {
  if (enabled_ && !(cfg_.init_scale > 0 && std::isfinite(cfg_.init_scale)))
    throw ConfigError("amp.init_scale must be a positive finite number, got " + std::to_string(cfg_.init_scale),
                      "the default is 65536");
  state_.scale = cfg_.init_scale;
}

at::Tensor GradScaler::scale(const at::Tensor& loss) const { return enabled() ? loss * state_.scale : loss; }

bool GradScaler::update(bool found_inf) {
  if (!enabled()) return false;
  if (found_inf) {
    ++state_.skipped_steps;
    state_.growth_tracker = 0;
    state_.scale *= cfg_.backoff_factor;
    return true;
  }
  if (++state_.growth_tracker < cfg_.growth_interval) return false;
  state_.growth_tracker = 0;
  // As PyTorch: growing must not overflow the scale itself to inf.
  const double grown = state_.scale * cfg_.growth_factor;
  if (!std::isfinite(static_cast<float>(grown))) return false;
  state_.scale = grown;
  return true;
}

void GradScaler::load_state(const ScalerState& s) {
  if (!(s.scale > 0 && std::isfinite(s.scale)) || s.growth_tracker < 0 || s.skipped_steps < 0)
    throw CheckpointError("the checkpoint's loss-scaler state is invalid (scale " + std::to_string(s.scale) + ")",
                          "resume from an older checkpoint, or start the run over");
  state_ = s;
}

bool unscale_and_check(const std::vector<at::Tensor>& grads, double inv_scale) {
  at::NoGradGuard no_grad;
  // The fused kernel (CUDA; CPU too from LibTorch 2.3) takes one device and dtype per call, as
  // GradScaler._unscale_grads_ groups them.
  std::map<std::tuple<int, int, int>, std::vector<at::Tensor>> fused_groups;
  double sum = 0;
  for (const auto& g : grads) {
    if (!g.defined()) continue;
    if (g.is_cuda() || util::compat::kAmpUnscaleKernelOnCpu) {
      fused_groups[{static_cast<int>(g.device().type()), g.device().index(), static_cast<int>(g.scalar_type())}]
          .push_back(g);
      continue;
    }
    if (inv_scale != 1.0) g.mul_(inv_scale);
    // A float64 sum is finite exactly when every element is: inf and NaN propagate, and float32 or
    // float16 values cannot overflow a double sum.
    sum += g.sum(at::kDouble).item<double>();
  }
  bool found = !std::isfinite(sum);
  for (auto& [key, group] : fused_groups) {
    const auto dev = group.front().device();
    auto found_inf = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(dev));
    auto inv = at::full({1}, inv_scale, at::TensorOptions().dtype(at::kFloat).device(dev));
    at::_amp_foreach_non_finite_check_and_unscale_(group, found_inf, inv);
    found = found || found_inf.item<float>() > 0;
  }
  return found;
}

}  // namespace cohort::amp

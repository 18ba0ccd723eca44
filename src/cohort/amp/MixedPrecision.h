// The run's precision policy (amp.precision) in one object, so the training loop reads the same in every
// mode: which dtype the forward computes in, how the model's weights are stored, how the loss is scaled
// before backward, and what happens when a scaled gradient overflows.
//
//   cohort::amp::MixedPrecision mp(cfg.amp, device, /*lead=*/rank == 0);
//   mp.prepare_model(*model);                             // fp16-master: fp16 weights, fp32 batch norm
//   { auto ac = mp.autocast(); logits = model->forward(mp.input(images)); loss = ...; }
//   mp.scale(loss).backward();
//   auto r = strategy->step(lr, mp.step_options(clip));   // unscale, agree on inf/NaN, maybe skip
//   mp.after_step(r.nonfinite, step);                     // logs a skip, updates the scale
//
// Note [The mixed-precision dtype contract]
// - fp32: everything fp32.
// - bf16: weights, gradients and optimizer fp32; autocast runs conv/matmul in bf16. No loss scaling:
//   bf16 has fp32's exponent range.
// - fp16: as bf16 with fp16, plus dynamic loss scaling (torch.cuda.amp, Apex O1). On CPU LibTorch has no
//   fp16 kernels for conv, matmul or batch norm, and CPU autocast takes bf16 only, so the forward computes
//   in fp32 there while the loss scaling runs unchanged; rank 0 says so at start.
// - fp16-master: weights and gradients fp16 except batch norm's (fp32); the optimizer updates fp32
//   master copies (amp/MasterWeights.h); inputs are cast to fp16; the loss is computed from fp32 logits;
//   dynamic loss scaling. CUDA only, for the reason above.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <torch/nn/module.h>
#include <nlohmann/json.hpp>

#include "cohort/amp/Autocast.h"
#include "cohort/amp/GradScaler.h"
#include "cohort/config/Config.h"

namespace cohort::amp {

enum class Precision { kFp32, kBf16, kFp16, kFp16Master };
Precision parse_precision(const std::string& name);

class MixedPrecision {
 public:
  // Throws ConfigError for fp16-master on a CPU device.
  MixedPrecision(const AmpConfig& cfg, c10::Device device, bool lead);

  Precision precision() const { return precision_; }
  const std::string& name() const { return name_; }
  // The dtype conv and matmul compute in: "float32", "bfloat16" or "float16".
  std::string compute_dtype() const;

  void prepare_model(torch::nn::Module& model) const;
  // Holds autocast on for the scope of the returned guard (a no-op guard in fp32 and fp16-master).
  std::unique_ptr<AutocastGuard> autocast() const;
  at::Tensor input(const at::Tensor& images) const;
  // Logits as the loss should see them: fp32.
  at::Tensor logits(const at::Tensor& out) const;
  at::Tensor scale(const at::Tensor& loss) const { return scaler_.scale(loss); }

  bool scaling() const { return scaler_.enabled(); }
  double loss_scale() const { return scaler_.scale(); }
  // After strategy->step: `nonfinite` is the flag every rank agreed on. Under loss scaling rank 0 logs
  // the skipped step and the new scale in one line (the first 20 times, then every 100th), and the scale
  // backs off or grows.
  void after_step(bool nonfinite, int64_t step);

  const GradScaler& scaler() const { return scaler_; }
  void load_scaler(const ScalerState& s) { scaler_.load_state(s); }
  // For summary.json: precision, compute dtype, and under loss scaling the final scale and skips.
  nlohmann::json summary() const;

 private:
  Precision precision_;
  std::string name_;
  c10::Device device_;
  bool lead_;
  GradScaler scaler_;
};

}  // namespace cohort::amp

#include "cohort/amp/MixedPrecision.h"

#include <iostream>
#include <sstream>

#include "cohort/amp/MasterWeights.h"
#include "cohort/util/Error.h"

namespace cohort::amp {

Precision parse_precision(const std::string& name) {
  if (name == "fp32") return Precision::kFp32;
  if (name == "bf16") return Precision::kBf16;
  if (name == "fp16") return Precision::kFp16;
  if (name == "fp16-master") return Precision::kFp16Master;
  COHORT_ASSERT(name != "auto", "amp.precision=auto resolved (train::resolve_auto) before MixedPrecision");
  throw ConfigError("amp.precision '" + name + "' is not a precision cohort knows",
                    "use fp32, bf16, fp16 or fp16-master");
}

MixedPrecision::MixedPrecision(const AmpConfig& cfg, c10::Device device, bool lead)
    : precision_(parse_precision(cfg.precision)),
      name_(cfg.precision),
      device_(device),
      lead_(lead),
      scaler_(cfg, /*enabled=*/precision_ == Precision::kFp16 || precision_ == Precision::kFp16Master) {
  if (precision_ == Precision::kFp16Master && device_.is_cpu())
    throw ConfigError(
        "amp.precision=fp16-master needs a CUDA device: LibTorch's CPU kernels for convolution, "
        "matrix products and batch norm do not take fp16 weights",
        "on CPU use amp.precision=bf16, or fp16 (loss scaling with fp32 compute)");
  if (precision_ == Precision::kFp16 && device_.is_cpu() && lead_)
    std::cout << "cohort: note: amp.precision=fp16 on CPU: LibTorch has no fp16 CPU kernels for conv and matmul, "
                 "so the forward computes in fp32; dynamic loss scaling runs as on a GPU (use bf16 for 16-bit "
                 "compute on CPU)"
              << std::endl;
}

std::string MixedPrecision::compute_dtype() const {
  switch (precision_) {
    case Precision::kBf16: return "bfloat16";
    case Precision::kFp16: return device_.is_cpu() ? "float32" : "float16";
    case Precision::kFp16Master: return "float16";
    default: return "float32";
  }
}

void MixedPrecision::prepare_model(torch::nn::Module& model) const {
  if (precision_ == Precision::kFp16Master) keep_batchnorm_fp32_else_half(model);
}

std::unique_ptr<AutocastGuard> MixedPrecision::autocast() const {
  const bool on = precision_ == Precision::kBf16 || (precision_ == Precision::kFp16 && !device_.is_cpu());
  return std::make_unique<AutocastGuard>(device_.type(), precision_ == Precision::kBf16 ? at::kBFloat16 : at::kHalf,
                                         on);
}

at::Tensor MixedPrecision::input(const at::Tensor& images) const {
  return precision_ == Precision::kFp16Master ? images.to(at::kHalf) : images;
}

at::Tensor MixedPrecision::logits(const at::Tensor& out) const {
  return out.scalar_type() == at::kFloat ? out : out.to(at::kFloat);
}

void MixedPrecision::after_step(bool nonfinite, int64_t step) {
  if (!scaler_.enabled()) return;
  const double before = scaler_.scale();
  scaler_.update(nonfinite);
  const int64_t skips = scaler_.state().skipped_steps;
  if (nonfinite && lead_ && (skips <= 20 || skips % 100 == 0)) {
    // Its own stream: std::cout may carry the progress lines' fixed precision.
    std::ostringstream line;
    line << "cohort: step " << step << ": gradient overflow (inf/NaN) on some rank; skipped the update on every "
         << "rank; loss scale " << before << " -> " << scaler_.scale() << " (" << skips << " skipped so far)";
    std::cout << line.str() << std::endl;
  }
}

nlohmann::json MixedPrecision::summary() const {
  nlohmann::json j = {{"precision", name_}, {"compute_dtype", compute_dtype()}};
  if (scaler_.enabled()) {
    j["loss_scale"] = scaler_.scale();
    j["skipped_steps"] = scaler_.state().skipped_steps;
  }
  return j;
}

}  // namespace cohort::amp

#include "cohort/models/Loss.h"

#include <torch/nn/functional/loss.h>

namespace cohort::models {

at::Tensor training_loss(const at::Tensor& logits, const at::Tensor& labels, const LossConfig& cfg) {
  namespace F = torch::nn::functional;
  return F::cross_entropy(logits, labels, F::CrossEntropyFuncOptions().label_smoothing(cfg.label_smoothing));
}

}  // namespace cohort::models

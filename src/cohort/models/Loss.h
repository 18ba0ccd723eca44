// The training loss, in one place for the trainer, the benchmarks and the reference test: cross-entropy
// of the logits against integer labels with label smoothing (loss.label_smoothing), which is what
// torch.nn.functional.cross_entropy(logits, labels, label_smoothing=s) computes (tests/reference/loss.py
// checks it against torch 2.14, loss and gradient).
//
//   auto loss = cohort::models::training_loss(logits, labels, cfg.loss);
//   loss.backward();
#pragma once

#include <ATen/ATen.h>

#include "cohort/config/Config.h"

namespace cohort::models {

at::Tensor training_loss(const at::Tensor& logits, const at::Tensor& labels, const LossConfig& cfg);

}  // namespace cohort::models

// Test-set evaluation across ranks, and the batching both training and evaluation use: each rank
// evaluates its DistributedSampler share on the training's device and in its precision, and the sums
// are all-reduced so every rank gets the global loss and top-1/top-5.
//
//   auto r = cohort::train::evaluate(*model, *data.test, sampler, 1000, /*prefetch=*/0, /*tta=*/0, comm,
//                                    {device, /*channels_last=*/false, &precision});
//   double top1 = r.top1();
#pragma once

#include <cstdint>
#include <vector>

#include "cohort/amp/MixedPrecision.h"
#include "cohort/comm/Communicator.h"
#include "cohort/data/DistributedSampler.h"
#include "cohort/data/Source.h"
#include "cohort/models/Models.h"
#include "cohort/record/Metrics.h"

namespace cohort::train {

// Consecutive slices of `order`: `count` batches of `size` from batch `first` on; the last one is short
// when `order` runs out (evaluation), never for training, whose batches are whole by construction.
std::vector<std::vector<int64_t>> batches_of(const std::vector<int64_t>& order, int64_t size, int64_t first,
                                             int64_t count);

// Where evaluation runs and in which precision: the training's own device and autocast (none: fp32).
struct EvalPlacement {
  c10::Device device{c10::kCPU};
  bool channels_last = false;
  const amp::MixedPrecision* precision = nullptr;
};

// Collective: every rank calls it. The model is left in training mode.
record::MetricSums evaluate(models::Classifier& model, data::Source& test, const data::DistributedSampler& sampler,
                            int64_t batch_size, int64_t prefetch, int64_t tta, comm::Communicator& comm,
                            const EvalPlacement& place);

}  // namespace cohort::train

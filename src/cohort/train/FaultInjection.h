// Faults a test can inject into a real training run through the environment, so the recovery paths
// run in real processes: COHORT_FAULT_STEP (SIGKILL after a step, handled in Trainer.cpp) and
// COHORT_FAULT_NONFINITE_STEPS (an inf or NaN gradient on one rank, as an fp16 overflow would give).
//
//   const auto steps = cohort::train::fault_steps_from_env("COHORT_FAULT_NONFINITE_STEPS");  // "3,8"
//   if (rank == fault_rank && steps.count(step)) cohort::train::poison_gradient(*model, step);
#pragma once

#include <cstdint>
#include <set>

#include <torch/nn/module.h>

namespace cohort::train {

// The comma-separated step numbers in environment variable `name` (empty when unset).
std::set<int64_t> fault_steps_from_env(const char* name);

// The first element of the first gradient becomes inf (odd steps) or NaN (even steps).
void poison_gradient(torch::nn::Module& model, int64_t step);

}  // namespace cohort::train

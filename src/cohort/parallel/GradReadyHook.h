// "This parameter's gradient is accumulated" callbacks, the trigger of both gradient synchronizers
// (ddp's Reducer and the zero2/fsdp reduce-scatter): an autograd post-hook on each parameter's gradient
// accumulator, the portable way in LibTorch 1.13 and 2.x (FACTS.md; register_post_accumulate_grad_hook
// has a C++ side in 2.x only).
//
//   fire_ = std::make_shared<std::function<void(size_t)>>([this](size_t i) { on_gradient_ready(i); });
//   accumulators_ = cohort::parallel::attach_grad_ready_hooks(params, fire_);   // keep both alive
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include <ATen/ATen.h>

#include "cohort/util/OldNames.h"  // the names of the last release, for programs outside this tree

namespace cohort::parallel {

// After each backward writes params[i].grad(), calls (*fire)(i), on the autograd thread. The hooks
// hold `fire` weakly: autograd may keep an accumulator (and its hook) alive after the owner is gone,
// and the hook then does nothing. Returns the accumulators, which the caller must keep (autograd holds
// them weakly, and a dropped one loses its hook). Every parameter must require grad.
std::vector<std::shared_ptr<void>> attach_grad_ready_hooks(const std::vector<at::Tensor>& params,
                                                           std::weak_ptr<std::function<void(size_t)>> fire);

}  // namespace cohort::parallel

// Runs the ops of a scope in a lower precision where that is safe (convolutions and matrix products in
// bf16 or fp16, reductions and losses in fp32): torch.autocast for C++. Thread-local, like PyTorch's.
//
//   {
//     cohort::amp::AutocastGuard autocast(at::kCUDA, at::kHalf);
//     auto logits = model->forward(images);   // conv/linear run in fp16
//   }
//   loss.backward();                          // outside: backward follows the forward's dtypes
#pragma once

#include <ATen/autocast_mode.h>

#include "cohort/util/TorchCompat.h"

namespace cohort::amp {

class AutocastGuard {
 public:
  // enabled == false leaves autocast as it is (a no-op guard keeps callers free of branches).
  AutocastGuard(c10::DeviceType device, at::ScalarType dtype, bool enabled = true)
      : device_(device), enabled_(enabled) {
    if (!enabled_) return;
    prev_enabled_ = util::compat::autocast_enabled(device_);
    prev_dtype_ = util::compat::autocast_dtype(device_);
    util::compat::set_autocast(device_, true, dtype);
    at::autocast::increment_nesting();
  }
  ~AutocastGuard() {
    if (!enabled_) return;
    // As torch.autocast's __exit__: the cache of casted weights lives for the outermost scope only, so
    // the next forward sees the weights the optimizer just updated.
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    util::compat::set_autocast(device_, prev_enabled_, prev_dtype_);
  }
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  c10::DeviceType device_;
  bool enabled_;
  bool prev_enabled_ = false;
  at::ScalarType prev_dtype_ = at::kFloat;
};

}  // namespace cohort::amp

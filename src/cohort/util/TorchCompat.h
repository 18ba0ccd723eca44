// The one place where LibTorch 1.13 (Debian) and 2.x (pip, GPU machine) differ for cohort.
//
// Everything else includes this header instead of branching on versions itself:
//
//   cohort::util::compat::WorkPtr w = pg->allreduce(tensors);
//
// Branch on TORCH_VERSION_MAJOR, not on __has_include: 1.13 already ships headers (Backend.hpp) its
// process groups do not use (FACTS.md).
#pragma once

#include <torch/version.h>

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>

#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

// LibTorch MAJOR.MINOR or newer; usable in #if.
#define COHORT_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace cohort::util::compat {

// 1.13 already has c10d::Work in Work.hpp; 2.x keeps the name. Kept as an alias so a future rename
// stays in this file.
using Work = ::c10d::Work;
using WorkPtr = c10::intrusive_ptr<::c10d::Work>;

inline constexpr int kTorchMajor = TORCH_VERSION_MAJOR;
inline constexpr int kTorchMinor = TORCH_VERSION_MINOR;

// c10d's Gloo process group has reduce-scatter and all-gather over one flat tensor from 2.2 on
// (`_reduce_scatter_base`, `_allgather_base`); 1.13 declares them and throws "not supported" (FACTS.md).
// Where they exist, GlooCommunicator uses `_allgather_base`, and for a reduce-scatter the all-reduce that
// 2.x's `_reduce_scatter_base` is made of (GlooCommunicator.cpp says why), instead of its all-to-all and
// per-rank-list fallbacks.
inline constexpr bool kGlooHasFlatCollectives = COHORT_TORCH_AT_LEAST(2, 2);

// The fused unscale-and-check kernel (`_amp_foreach_non_finite_check_and_unscale_`) has a CPU kernel from
// 2.3 on; 1.13 has only the CUDA one (a dispatch error on CPU, FACTS.md), so GradScaler unscales CPU
// gradients with ordinary ops there.
inline constexpr bool kAmpUnscaleKernelOnCpu = COHORT_TORCH_AT_LEAST(2, 3);

// self[i] += weight * (end[i] - self[i]) for every i: at::_foreach_lerp_ from 2.0 on; 1.13 has none, and
// gets lerp's formula for weights under 0.5 in two multi-tensor calls (Note [One call per operation per
// group] in optim/Sgd.cpp).
inline void foreach_lerp_(at::TensorList self, at::TensorList end, double weight) {
#if TORCH_VERSION_MAJOR >= 2
  at::_foreach_lerp_(self, end, weight);
#else
  at::_foreach_add_(self, at::_foreach_sub(end, self), weight);
#endif
}

// TCPStore options: 2.x adds useLibUV (default true). libuv's server rejects some clients built without
// it; the classic socket server behaves the same in both versions, so we ask for it explicitly.
inline ::c10d::TCPStoreOptions tcp_store_options(uint16_t port, bool is_server, size_t num_workers,
                                                 std::chrono::milliseconds timeout) {
  ::c10d::TCPStoreOptions opts;
  opts.port = port;
  opts.isServer = is_server;
  opts.numWorkers = num_workers;
  opts.waitWorkers = false;
  opts.timeout = timeout;
  opts.multiTenant = false;
#if TORCH_VERSION_MAJOR >= 2
  opts.useLibUV = false;
#endif
  return opts;
}

// Autocast state per device type. 1.13 has one function pair per device (set_cpu_enabled,
// set_autocast_gpu_dtype...); 2.4+ has device-generic ones and deprecates the old (FACTS.md).
inline bool autocast_enabled(c10::DeviceType device) {
#if COHORT_TORCH_AT_LEAST(2, 4)
  return at::autocast::is_autocast_enabled(device);
#else
  return device == c10::DeviceType::CPU ? at::autocast::is_cpu_enabled() : at::autocast::is_enabled();
#endif
}

inline at::ScalarType autocast_dtype(c10::DeviceType device) {
#if COHORT_TORCH_AT_LEAST(2, 4)
  return at::autocast::get_autocast_dtype(device);
#else
  return device == c10::DeviceType::CPU ? at::autocast::get_autocast_cpu_dtype()
                                        : at::autocast::get_autocast_gpu_dtype();
#endif
}

inline void set_autocast(c10::DeviceType device, bool enabled, at::ScalarType dtype) {
#if COHORT_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_dtype(device, dtype);
  at::autocast::set_autocast_enabled(device, enabled);
#else
  if (device == c10::DeviceType::CPU) {
    at::autocast::set_autocast_cpu_dtype(dtype);
    at::autocast::set_cpu_enabled(enabled);
  } else {
    at::autocast::set_autocast_gpu_dtype(dtype);
    at::autocast::set_enabled(enabled);
  }
#endif
}

}  // namespace cohort::util::compat

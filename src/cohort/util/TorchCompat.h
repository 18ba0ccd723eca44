// The one place where LibTorch 1.13 (Debian) and 2.x (pip, GPU machine) differ for cohort.
//
// Everything else includes this header instead of branching on versions itself:
//
//   cohort::compat::WorkPtr w = pg->allreduce(tensors);
//
// Branch on TORCH_VERSION_MAJOR, not on __has_include: 1.13 already ships headers (Backend.hpp) its
// process groups do not use (FACTS.md).
#pragma once

#include <torch/version.h>

#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

namespace cohort::compat {

// 1.13 already has c10d::Work in Work.hpp; 2.x keeps the name. Kept as an alias so a future rename
// stays in this file.
using Work = ::c10d::Work;
using WorkPtr = c10::intrusive_ptr<::c10d::Work>;

inline constexpr int kTorchMajor = TORCH_VERSION_MAJOR;
inline constexpr int kTorchMinor = TORCH_VERSION_MINOR;

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

}  // namespace cohort::compat

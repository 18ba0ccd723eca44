// Ranks as threads in one process over real Gloo with an in-process store (c10d's own C++ tests do
// the same): fast, no ports, and a failure in any rank fails the test.
#pragma once

#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "cohort/comm/GlooCommunicator.h"

// A build without gloo's headers (pip's LibTorch without -DGLOO_INCLUDE_DIR: CMakeLists.txt) has no Gloo
// backend; a test that runs ranks over it starts with this and skips there, saying why.
#ifdef COHORT_HAVE_GLOO
#define SKIP_WITHOUT_GLOO() static_cast<void>(0)
#else
#define SKIP_WITHOUT_GLOO()                                                                      \
  GTEST_SKIP() << "this build has no Gloo backend (no gloo headers were found): configure with " \
                  "-DGLOO_INCLUDE_DIR=$(scripts/gloo-headers)"
#endif

namespace cohort::testing {

inline void run_ranks(int world, const std::function<void(int rank, comm::CommunicatorPtr comm)>& body,
                      std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(world);
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto comm = comm::GlooCommunicator::create(store, r, world, "127.0.0.1", timeout);
        body(r, comm);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace cohort::testing

namespace cohort::testing {

// One global batch of 8x8 single-channel images and labels in [0, 10) per step, drawn from fixed seeds.
// The global generator is shared by rank threads, so tests draw all of it up front, serially.
struct Batch {
  at::Tensor x, y;
};
inline std::vector<Batch> random_batches(int steps, int64_t global_batch, uint64_t seed_base) {
  std::vector<Batch> out;
  for (int s = 0; s < steps; ++s) {
    torch::manual_seed(seed_base + s);
    out.push_back({torch::randn({global_batch, 1, 8, 8}), torch::randint(0, 10, {global_batch}, torch::kLong)});
  }
  return out;
}

}  // namespace cohort::testing

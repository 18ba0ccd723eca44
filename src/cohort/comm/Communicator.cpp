#include "cohort/comm/Communicator.h"

#include <atomic>

namespace cohort::comm {
namespace {

class ThenHandle : public Handle {
 public:
  ThenHandle(HandlePtr inner, std::function<void()> fn) : inner_(std::move(inner)), fn_(std::move(fn)) {}
  void wait() override {
    if (done_) return;
    if (inner_) inner_->wait();
    if (fn_) fn_();
    done_ = true;
  }
  // The communication is done: wait() would only run fn_.
  bool is_completed() override { return done_ || !inner_ || inner_->is_completed(); }

 private:
  HandlePtr inner_;
  std::function<void()> fn_;
  bool done_ = false;
};

// Relaxed: a sum of durations that readers sample between steps, ordering nothing else.
std::atomic<int64_t> g_wait_ns{0};

}  // namespace

double collective_wait_seconds() { return static_cast<double>(g_wait_ns.load(std::memory_order_relaxed)) * 1e-9; }

CollectiveWaitTimer::~CollectiveWaitTimer() {
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start_);
  g_wait_ns.fetch_add(ns.count(), std::memory_order_relaxed);
}

HandlePtr then(HandlePtr inner, std::function<void()> fn) {
  return std::make_shared<ThenHandle>(std::move(inner), std::move(fn));
}

HandlePtr deferred(std::function<void()> fn) { return std::make_shared<ThenHandle>(nullptr, std::move(fn)); }

}  // namespace cohort::comm

// The pieces of one collective sent as several c10d works, and a thread that waits on them, so that the
// collective's end can be polled. c10d's Gloo send/recv works learn that they finished only inside
// wait(); a caller that polls is_completed() while it computes (ddp's buckets, optim.in_backward) needs
// someone else to wait. GlooCommunicator's reduce-scatter on LibTorch 1.13 is the user (Note
// [Reduce-scatter and all-gather in pieces on LibTorch 1.13] in comm/GlooCommunicator.cpp).
//
//   auto e = std::make_shared<cohort::comm::PieceExchange>();
//   e->timeout = std::chrono::seconds(30);
//   e->works.push_back(pg->send(pieces, to, tag));   // and the matching recv
//   waiter.add(e);                                    // a cohort::comm::ExchangeWaiter, one per communicator
//   while (!e->done()) compute_something();
//   e->wait();                                        // rethrows what a work threw
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "cohort/util/TorchCompat.h"

namespace cohort::comm {

struct PieceExchange {
  std::vector<util::compat::WorkPtr> works;
  std::chrono::milliseconds timeout{};
  std::mutex m;
  std::condition_variable cv;
  bool finished = false;
  std::exception_ptr error;

  bool done() {
    std::lock_guard<std::mutex> lock(m);
    return finished;
  }
  void wait() {
    std::unique_lock<std::mutex> lock(m);
    cv.wait(lock, [&] { return finished; });
    if (error) std::rethrow_exception(error);
  }
};

// Waits on each exchange's works in the order they were issued, within the collective's timeout. The
// thread is detached at shutdown: a wait blocked on a dead peer ends with Gloo's own timeout, and the
// queue it reads is shared with it, not owned by the communicator.
class ExchangeWaiter {
 public:
  ExchangeWaiter() : q_(std::make_shared<Queue>()) {
    std::thread([q = q_] { run(*q); }).detach();
  }
  ~ExchangeWaiter() {
    std::lock_guard<std::mutex> lock(q_->m);
    q_->stop = true;
    q_->cv.notify_all();
  }
  void add(std::shared_ptr<PieceExchange> e) {
    std::lock_guard<std::mutex> lock(q_->m);
    q_->pending.push_back(std::move(e));
    q_->cv.notify_all();
  }

 private:
  struct Queue {
    std::mutex m;
    std::condition_variable cv;
    std::deque<std::shared_ptr<PieceExchange>> pending;
    bool stop = false;
  };

  static void run(Queue& q) {
    for (;;) {
      std::shared_ptr<PieceExchange> e;
      {
        std::unique_lock<std::mutex> lock(q.m);
        q.cv.wait(lock, [&] { return q.stop || !q.pending.empty(); });
        if (q.pending.empty()) return;
        e = std::move(q.pending.front());
        q.pending.pop_front();
      }
      std::exception_ptr error;
      const auto deadline = std::chrono::steady_clock::now() + e->timeout;
      try {
        for (auto& w : e->works) {
          const auto left =
              std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
          w->wait(std::max(left, std::chrono::milliseconds(1)));
        }
      } catch (...) {
        error = std::current_exception();
      }
      std::lock_guard<std::mutex> lock(e->m);
      e->error = std::move(error);  // nothing of the exception stays with this thread past the lock
      e->finished = true;
      e->cv.notify_all();
    }
  }

  std::shared_ptr<Queue> q_;
};

}  // namespace cohort::comm

// The collectives cohort's parallel strategies are written against: all-reduce, broadcast, all-gather,
// reduce-scatter and barrier, each asynchronous, each wait bounded by the communicator's timeout.
//
//   auto h = comm->all_reduce(grads, cohort::comm::ReduceOp::kSum, "bucket 0");
//   ...                       // overlap: more backward runs here
//   h->wait();                // throws cohort::CommError naming the collective and the ranks on timeout
//
// Backends (Gloo now, NCCL later) implement it; a backend that is not built fails at creation with a
// message saying so.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "cohort/util/OldNames.h"  // the names of the last release, for programs outside this tree

namespace cohort::comm {

class FlightRecorder;

enum class ReduceOp { kSum, kMax, kMin };

// One collective in flight.
class Handle {
 public:
  virtual ~Handle() = default;
  // Blocks until the collective completes; throws CommError when it fails or times out.
  virtual void wait() = 0;
  // The communication is done, so wait() returns without waiting for other ranks (it may still unpack
  // a result on this thread). Never blocks.
  virtual bool is_completed() = 0;
};
using HandlePtr = std::shared_ptr<Handle>;

// Seconds this process has spent blocked in the backends' Handle::wait since it started, on any thread.
// The training loop's phase clock (record/PhaseClock.h) counts them as communication that computation did
// not hide. A backend's wait() holds a CollectiveWaitTimer for as long as it blocks the host.
double collective_wait_seconds();
class CollectiveWaitTimer {
 public:
  CollectiveWaitTimer() : start_(std::chrono::steady_clock::now()) {}
  ~CollectiveWaitTimer();
  CollectiveWaitTimer(const CollectiveWaitTimer&) = delete;
  CollectiveWaitTimer& operator=(const CollectiveWaitTimer&) = delete;

 private:
  std::chrono::steady_clock::time_point start_;
};

// A handle that completes when `inner` has and `fn` has run once after it, on the thread that waits:
// how a hook turns "all-reduce done" into "result unpacked" without a thread of its own.
HandlePtr then(HandlePtr inner, std::function<void()> fn);
// A handle for work that needs no communication: wait() runs `fn` once.
HandlePtr deferred(std::function<void()> fn);

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend_name() const = 0;
  virtual std::chrono::milliseconds timeout() const = 0;

  // `what` names the collective's purpose ("bucket 3", "eval metrics") in error messages.
  // Tensors must stay alive and untouched until the handle's wait() returns.
  virtual HandlePtr all_reduce(const at::Tensor& tensor, ReduceOp op, const std::string& what) = 0;
  virtual HandlePtr broadcast(const at::Tensor& tensor, int root, const std::string& what) = 0;
  // output holds size() chunks of input's numel, rank r's input lands in chunk r.
  virtual HandlePtr all_gather(const at::Tensor& output, const at::Tensor& input, const std::string& what) = 0;
  // input holds size() chunks of output's numel; rank r receives the reduction of every rank's chunk r.
  // output may be input's own chunk r (in place), as NCCL allows.
  virtual HandlePtr reduce_scatter(const at::Tensor& output, const at::Tensor& input, ReduceOp op,
                                   const std::string& what) = 0;
  virtual HandlePtr barrier(const std::string& what) = 0;

  // Debug mode (dist.debug=detail, or TORCH_DISTRIBUTED_DEBUG=DETAIL as in PyTorch): before every
  // collective the ranks compare what they are about to call (kind, dtype, element count) and a
  // mismatch throws CommError naming each rank's call, instead of hanging or mixing unrelated data.
  // Costs one small synchronous all-gather per collective.
  virtual void set_debug(bool on) {}
  // This rank's last collectives, for `cohort doctor` (comm/FlightRecorder.h); null where a backend keeps none.
  virtual std::shared_ptr<comm::FlightRecorder> flight() const { return nullptr; }
};
using CommunicatorPtr = std::shared_ptr<Communicator>;

}  // namespace cohort::comm

// The NCCL backend of cohort::comm::Communicator, for CUDA tensors: one NCCL communicator per process on the
// GPU of its local rank, collectives on a stream of its own, and a watchdog that aborts the communicator
// when a collective outlives timeout(), so that a dead or diverging rank ends in a CommError, not a hang.
//
//   auto comm = cohort::comm::NcclCommunicator::create(store, rank, world, local_rank, std::chrono::seconds(300));
//   auto h = comm->all_reduce(grads, cohort::comm::ReduceOp::kSum, "bucket 0");
//   h->wait();   // the current CUDA stream waits for the result; the host does not
//
// wait() is asynchronous for the host, as c10d's Work::wait is for NCCL: it orders the caller's current
// stream after the collective and returns (Note [Sync streams and recordStream] in the .cpp says why
// the tensors may then be freed at once). A collective that times out after that surfaces as a
// CommError from the next call on the communicator (and a line on stderr); barrier()'s wait() blocks
// the host and throws itself. Call collectives from one thread, in the same order on every rank.
// As with Gloo, a timeout names the ranks that never issued the collective or stopped answering
// (comm/PeerWatch, through the store), and set_debug(true) checks every collective's signature first.
//
// Compiled only when cohort is built against a LibTorch with CUDA (COHORT_CUDA=ON, which defines
// COHORT_HAVE_NCCL); otherwise dist.backend=nccl fails in rendezvous() with a message saying so.
#pragma once

#include <chrono>
#include <memory>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "cohort/comm/Communicator.h"
#include "cohort/comm/PeerWatch.h"
#include "cohort/util/OldNames.h"  // the names of the last release, for programs outside this tree

namespace cohort::comm {

namespace detail {
struct NcclState;  // the NCCL communicator, its stream and the watchdog; shared with handles in flight
}  // namespace detail

class NcclCommunicator : public Communicator {
 public:
  // Rank 0 creates NCCL's unique id and publishes it in `store` (give each communicator its own
  // prefix); every rank then joins on device `device_index` (its local rank). Throws CommError when the
  // device does not exist or the ranks do not all join within `timeout`.
  static CommunicatorPtr create(c10::intrusive_ptr<c10d::Store> store, int rank, int size, int device_index,
                                std::chrono::milliseconds timeout);

  explicit NcclCommunicator(std::shared_ptr<detail::NcclState> state);
  // Destroys the NCCL communicator, or aborts it when a collective failed, is still in flight, or an
  // exception is unwinding (the peers may be gone, and a clean destroy would wait for them).
  ~NcclCommunicator() override;

  int rank() const override;
  int size() const override;
  std::string backend_name() const override { return "nccl"; }
  std::chrono::milliseconds timeout() const override;

  // Tensors must be contiguous, on this communicator's device or on the host, of type float, half,
  // bfloat16, double, int32, int64 or uint8; anything else throws CommError. Host tensors are staged
  // through the device and their wait() blocks the host (Note [Host tensors through NCCL] in the .cpp).
  HandlePtr all_reduce(const at::Tensor& tensor, ReduceOp op, const std::string& what) override;
  HandlePtr broadcast(const at::Tensor& tensor, int root, const std::string& what) override;
  HandlePtr all_gather(const at::Tensor& output, const at::Tensor& input, const std::string& what) override;
  HandlePtr reduce_scatter(const at::Tensor& output, const at::Tensor& input, ReduceOp op,
                           const std::string& what) override;
  // An all-reduce of one element; its wait() blocks the host until every rank has arrived.
  HandlePtr barrier(const std::string& what) override;

  // dist.debug=detail: before each collective, every rank's (kind, dtype, size) is all-gathered (a
  // host-blocking NCCL all-gather of 3 numbers) and compared; a difference is a CommError naming each
  // rank's call.
  void set_debug(bool on) override;
  // Each collective as launched, and as the watchdog sees its end event complete (within its 100 ms
  // poll) or the communicator abort; Note [The NCCL communicator's flight record] in the .cpp.
  std::shared_ptr<comm::FlightRecorder> flight() const override;

 private:
  void verify(comm::CollectiveKind kind, const at::Tensor& t, const std::string& what);
  HandlePtr gather(const at::Tensor& output, const at::Tensor& input, const std::string& what);
  std::shared_ptr<detail::NcclState> state_;
};

}  // namespace cohort::comm

// Over 450 lines on purpose: every collective of the NCCL backend with its stream, event and watchdog
// handling, which share private state; each collective is a short function.
#include "cohort/comm/NcclCommunicator.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <iostream>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <nccl.h>

#include "cohort/comm/FlightRecorder.h"
#include "cohort/util/Error.h"

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 14, 0)
#error "cohort's NCCL backend needs NCCL 2.14 or newer (ncclCommInitRankConfig, nonblocking communicators)"
#endif

namespace cohort::comm {
namespace detail {
namespace {

using Clock = std::chrono::steady_clock;

std::optional<ncclDataType_t> to_nccl(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return ncclFloat32;
    case at::kHalf: return ncclFloat16;
    case at::kBFloat16: return ncclBfloat16;
    case at::kDouble: return ncclFloat64;
    case at::kInt: return ncclInt32;
    case at::kLong: return ncclInt64;
    case at::kByte: return ncclUint8;
    default: return std::nullopt;
  }
}

ncclRedOp_t to_nccl(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kMin: return ncclMin;
  }
  return ncclSum;
}

std::string seconds(std::chrono::milliseconds d) {
  std::ostringstream os;
  os << d.count() / 1000.0 << " s";
  return os.str();
}

// Note [Nonblocking NCCL calls]
// The communicator is created with blocking=0, so every NCCL call returns at once, possibly with
// ncclInProgress while NCCL's own threads finish it (connection setup, first use of a peer); it may not
// be used again until ncclCommGetAsyncError reports that it settled. Polling here, rather than blocking
// inside NCCL, is what makes every call abortable: a call whose peer died never settles, and after the
// deadline the caller aborts the communicator instead of hanging in it. `pause` sleeps between polls
// (releasing whatever lock the caller holds) and returns false when the communicator was aborted meanwhile.
ncclResult_t settle(ncclComm_t comm, ncclResult_t r, Clock::time_point deadline,
                    const std::function<bool(std::chrono::microseconds)>& pause) {
  auto step = std::chrono::microseconds(20);
  while (r == ncclInProgress && Clock::now() < deadline) {
    if (!pause(step)) return ncclInProgress;
    step = std::min(step * 2, std::chrono::microseconds(10000));
    ncclResult_t async = ncclSuccess;
    const ncclResult_t q = ncclCommGetAsyncError(comm, &async);
    r = q != ncclSuccess ? q : async;
  }
  return r;
}

bool sleep_for(std::chrono::microseconds d) {
  std::this_thread::sleep_for(d);
  return true;
}

std::string nccl_error(ncclComm_t comm, ncclResult_t r) {
  std::string s = std::string("NCCL: ") + ncclGetErrorString(r);
  const char* last = ncclGetLastError(comm);
  if (last && *last) s += " (" + std::string(last) + ")";
  return s;
}

}  // namespace

// One launched collective, as the watchdog and the handle see it.
struct NcclWork {
  std::string desc;                          // "all_reduce 'bucket 3' (collective #12) on rank 0 of 8"
  uint64_t seq;                              // 12: what PeerWatch::diagnose asks about
  std::shared_ptr<at::cuda::CUDAEvent> end;  // recorded on the comm stream after the collective
  Clock::time_point launched;
};

struct NcclState {
  NcclState(int rank_, int size_, int device_, std::chrono::milliseconds timeout_, ncclComm_t comm_,
            c10::intrusive_ptr<c10d::Store> store)
      : rank(rank_),
        size(size_),
        device(static_cast<c10::DeviceIndex>(device_)),
        timeout(timeout_),
        comm(comm_),
        // High priority, as in c10d: a bucket's all-reduce should not queue behind backward kernels.
        stream(c10::cuda::getStreamFromPool(/*isHighPriority=*/true, device)),
        barrier_buf(at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(at::kCUDA, device))),
        peers(std::make_shared<comm::PeerWatch>(std::move(store), rank_, size_)) {}

  const int rank;
  const int size;
  const c10::DeviceIndex device;
  const std::chrono::milliseconds timeout;
  ncclComm_t comm;  // null once destroyed; freed by ncclCommAbort once `aborted`
  const c10::cuda::CUDAStream stream;
  const at::Tensor barrier_buf;
  const std::shared_ptr<comm::PeerWatch> peers;  // sequence numbers, heartbeat, who is missing
  const std::shared_ptr<comm::FlightRecorder> flight = std::make_shared<comm::FlightRecorder>();
  bool debug = false;

  // One mutex for the NCCL communicator and the watchdog's view, so that an abort can never race a
  // call into the communicator it frees. NCCL calls return at once (Note [Nonblocking NCCL calls]), so
  // the lock is never held for long.
  std::mutex mu;
  bool aborted = false;
  std::string failure, failure_desc, failure_hint;  // the first failure; every later call rethrows it
  std::deque<std::shared_ptr<NcclWork>> works;      // in launch order, which is completion order
  bool stopping = false;
  std::condition_variable cv;
  std::thread watchdog;

  std::string describe(const char* kind, const std::string& what, uint64_t n) const {
    std::ostringstream os;
    os << kind << " '" << what << "' (collective #" << n << ") on rank " << rank << " of " << size;
    return os.str();
  }

  // Records the first failure and aborts the communicator: NCCL's kernels then end, so no stream
  // waits forever on a collective whose peer is gone. Caller holds `mu`.
  void fail_locked(const std::string& desc, const std::string& msg, const std::string& hint) {
    if (!failure.empty()) return;
    failure = msg;
    failure_desc = desc;
    failure_hint = hint;
    for (const auto& w : works) flight->ended(w->seq, false);  // the abort ends them all
    if (comm && !aborted) {
      c10::cuda::CUDAGuard guard(device);
      ncclCommAbort(comm);
      aborted = true;
    }
  }

  void throw_if_failed_locked(const std::string& desc) const {
    if (failure.empty()) return;
    if (desc == failure_desc) throw CommError(failure, failure_hint);
    throw CommError(desc + " cannot run: the NCCL communicator was aborted after an earlier failure: " + failure,
                    failure_hint);
  }

  // `who`: PeerWatch::diagnose's finding, asked without holding `mu` (it takes seconds).
  void timed_out_locked(const NcclWork& w, const std::string& who) {
    std::string others;
    for (int r = 0; r < size; ++r)
      if (r != rank) others += (others.empty() ? "" : ",") + std::to_string(r);
    fail_locked(w.desc,
                w.desc + " did not complete within " + seconds(timeout) + ": of ranks {" + others +
                    "}, at least one did not reach it or died in it; " + who,
                "rerun with NCCL_DEBUG=INFO and check that every rank reached this collective (look for a "
                "rank-dependent branch, or a rank that failed first: see its error), or raise dist.timeout_s");
  }

  // One NCCL call on the communicator, settled (Note [Nonblocking NCCL calls]); throws CommError naming
  // `desc` when it fails or does not settle within the timeout.
  void call(const std::string& desc, const std::function<ncclResult_t()>& fn) {
    std::unique_lock<std::mutex> lock(mu);
    throw_if_failed_locked(desc);
    ncclResult_t r = settle(comm, fn(), Clock::now() + timeout, [&](std::chrono::microseconds d) {
      lock.unlock();
      std::this_thread::sleep_for(d);
      lock.lock();
      return !aborted;
    });
    throw_if_failed_locked(desc);  // the watchdog aborted while we polled
    if (r == ncclInProgress)
      fail_locked(desc, desc + ": NCCL did not finish setting it up within " + seconds(timeout),
                  "a peer rank may have died; rerun with NCCL_DEBUG=INFO to see which");
    else if (r != ncclSuccess)
      fail_locked(desc, desc + " failed: " + nccl_error(comm, r),
                  "rerun with NCCL_DEBUG=INFO; a peer rank that exited or a broken network link shows there");
    throw_if_failed_locked(desc);
  }

  // The watchdog: a collective whose end event has not completed within the timeout, or an asynchronous
  // NCCL error (a peer's connection broke), aborts the communicator. Works complete in launch order on
  // the one comm stream, so only the oldest can be late. The clock starts at launch on the host, as in
  // c10d, so compute queued before the collective counts too: the timeout is a bound for hangs, not a
  // measure of communication time.
  void watch() {
    std::unique_lock<std::mutex> lock(mu);
    while (!stopping && failure.empty()) {
      cv.wait_for(lock, std::chrono::milliseconds(100), [this] { return stopping; });
      if (stopping || !failure.empty()) break;  // a caller's own poll found the failure (and aborted)
      try {
        while (!works.empty() && works.front()->end->query()) {
          flight->ended(works.front()->seq, true);
          works.pop_front();
        }
        ncclResult_t async = ncclSuccess;
        ncclCommGetAsyncError(comm, &async);
        const std::string desc = works.empty() ? "the NCCL communicator" : works.front()->desc;
        if (async != ncclSuccess && async != ncclInProgress)
          fail_locked(desc, desc + " failed: " + nccl_error(comm, async),
                      "a peer rank exited or its network link broke; rerun with NCCL_DEBUG=INFO to see which");
        else if (!works.empty() && Clock::now() - works.front()->launched > timeout) {
          const auto late = works.front();
          lock.unlock();
          const std::string who = peers->diagnose(late->seq);
          lock.lock();
          // It may have completed, or a caller may have failed it, while we asked.
          if (!stopping && failure.empty() && !late->end->query()) timed_out_locked(*late, who);
        }
      } catch (const std::exception& e) {  // a CUDA error from the event query: the device is unusable
        const std::string desc = works.empty() ? "the NCCL communicator" : works.front()->desc;
        fail_locked(desc, desc + ": CUDA error: " + e.what(), "see the first CUDA error of this rank above");
      }
      // What the watchdog finds may have no caller to throw to until the next collective: say it now.
      if (!failure.empty())
        std::cerr << "cohort: rank " << rank << ": " << failure << "; the NCCL communicator was aborted" << std::endl;
    }
  }

  // Note [Sync streams and recordStream]
  // Collectives run on `stream`, not on the caller's current (compute) stream, so that communication
  // overlaps compute. Two hazards follow, and c10d's ProcessGroupNCCL handles them the same way:
  // 1. Order: the tensor's contents are written by kernels queued on the compute stream. The comm stream
  //    waits on an event recorded there before the collective, so NCCL reads the finished values.
  // 2. Lifetime: the caching allocator ties a block to the stream it was allocated on. If the caller
  //    frees the tensor once wait() returns (which does not wait for the GPU), the allocator could hand
  //    the block to a new compute-stream tensor while NCCL still reads or writes it on the comm stream.
  //    recordStream(block, comm stream) makes the allocator, when the block is freed, wait for the work
  //    queued on the comm stream by then before it reuses the block.
  // wait() closes the loop the other way: the compute stream waits on the collective's end event.
  //
  // launch() checks the tensors (the first is the input), then runs `collective` in this order.
  std::shared_ptr<NcclWork> launch(const char* kind, const std::string& what, const std::vector<at::Tensor>& tensors,
                                   const std::function<ncclResult_t(ncclDataType_t, cudaStream_t)>& collective) {
    const uint64_t seq = peers->issue();
    const std::string desc = describe(kind, what, seq);
    for (size_t i = 0; i < tensors.size(); ++i) check(tensors[i], i == 0 ? "input" : "output", desc);
    const ncclDataType_t dtype = *to_nccl(tensors[0].scalar_type());
    flight->issued(seq, kind, what, tensors[0]);
    c10::cuda::CUDAGuard guard(device);
    at::cuda::CUDAEvent ready;
    ready.record(c10::cuda::getCurrentCUDAStream(device));
    ready.block(stream);
    for (const auto& t : tensors) c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), stream);
    try {
      call(desc, [&] { return collective(dtype, stream.stream()); });
    } catch (...) {
      flight->ended(seq, false);
      throw;
    }
    auto work = std::make_shared<NcclWork>(NcclWork{desc, seq, std::make_shared<at::cuda::CUDAEvent>(), Clock::now()});
    work->end->record(stream);
    std::lock_guard<std::mutex> lock(mu);
    works.push_back(work);
    return work;
  }

  void check(const at::Tensor& t, const char* role, const std::string& desc) const {
    const std::string where = desc + ": the " + role + " tensor";
    if (!t.defined() || !t.is_cuda())
      throw CommError(where + " is " + (t.defined() ? "on " + t.device().str() : "undefined") +
                          "; the NCCL backend needs CUDA tensors",
                      "move the model and its tensors to cuda:<local rank> first, or use dist.backend=gloo for "
                      "CPU training");
    if (t.device().index() != device)
      throw CommError(where + " is on " + t.device().str() +
                          ", but this rank's NCCL communicator is on cuda:" + std::to_string(device),
                      "each rank uses the GPU of its local rank: .to(torch::Device(torch::kCUDA, local_rank))");
    if (!t.is_contiguous())
      throw CommError(
          where + " is not contiguous (sizes " + c10::str(t.sizes()) + ", strides " + c10::str(t.strides()) + ")",
          "pass .contiguous() or a flat bucket; NCCL reads one dense block of memory");
    if (!to_nccl(t.scalar_type()))
      throw CommError(where + " has type " + std::string(c10::toString(t.scalar_type())) +
                          ", which the NCCL backend does not carry",
                      "use float, half, bfloat16, double, int32, int64 or uint8");
  }

  // Closes the communicator: see ~NcclCommunicator.
  void shutdown() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stopping = true;
    }
    cv.notify_all();
    if (watchdog.joinable()) watchdog.join();
    std::lock_guard<std::mutex> lock(mu);
    if (!comm) return;
    c10::cuda::CUDAGuard guard(device);
    if (!aborted) {
      bool quiet = std::uncaught_exceptions() == 0;
      try {
        for (const auto& w : works) quiet = quiet && w->end->query();
      } catch (const std::exception&) {
        quiet = false;
      }
      // Finalize waits for this rank's outstanding NCCL work; bounded, as every wait here.
      const ncclResult_t r =
          quiet ? settle(comm, ncclCommFinalize(comm), Clock::now() + timeout, sleep_for) : ncclInProgress;
      if (r == ncclSuccess)
        ncclCommDestroy(comm);
      else
        ncclCommAbort(comm);
    }
    comm = nullptr;
  }
};

namespace {

class NcclHandle : public Handle {
 public:
  NcclHandle(std::shared_ptr<NcclState> state, std::shared_ptr<NcclWork> work, bool host_blocking)
      : state_(std::move(state)), work_(std::move(work)), host_blocking_(host_blocking) {}

  void wait() override {
    // Only a host-blocking wait stops the host; otherwise the stream waits and the time shows up wherever
    // the host next synchronizes with the GPU.
    if (host_blocking_) {
      const CollectiveWaitTimer blocked;
      wait_on_host();
    }
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      state_->throw_if_failed_locked(work_->desc);
    }
    // Like c10d's Work::wait: the current stream, not the host, waits for the collective.
    c10::cuda::CUDAGuard guard(state_->device);
    work_->end->block(c10::cuda::getCurrentCUDAStream(state_->device));
  }

  bool is_completed() override {
    std::lock_guard<std::mutex> lock(state_->mu);
    return !state_->failure.empty() || work_->end->query();
  }

 private:
  // Polls the end event with a growing pause, bounded by the timeout: a barrier is where the host must
  // know that every rank arrived.
  void wait_on_host() {
    auto step = std::chrono::microseconds(50);
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(state_->mu);
        state_->throw_if_failed_locked(work_->desc);
        if (work_->end->query()) return;
      }
      if (Clock::now() - work_->launched > state_->timeout) {
        const std::string who = state_->peers->diagnose(work_->seq);
        std::lock_guard<std::mutex> lock(state_->mu);
        state_->throw_if_failed_locked(work_->desc);
        if (work_->end->query()) return;  // it arrived while we asked
        state_->timed_out_locked(*work_, who);
        state_->throw_if_failed_locked(work_->desc);
      }
      std::this_thread::sleep_for(step);
      step = std::min(step * 2, std::chrono::microseconds(20000));
    }
  }

  std::shared_ptr<NcclState> state_;
  std::shared_ptr<NcclWork> work_;
  bool host_blocking_;
};

}  // namespace
}  // namespace detail

using detail::NcclHandle;

CommunicatorPtr NcclCommunicator::create(c10::intrusive_ptr<c10d::Store> store, int rank, int size, int device_index,
                                         std::chrono::milliseconds timeout) {
  const std::string who = "rank " + std::to_string(rank) + " of " + std::to_string(size);
  const int devices = c10::cuda::device_count();
  if (device_index < 0 || device_index >= devices)
    throw CommError(who + ": the NCCL backend needs cuda:" + std::to_string(device_index) + ", but " +
                        std::to_string(devices) + " CUDA device(s) are visible",
                    "start at most one process per GPU on each machine, and check CUDA_VISIBLE_DEVICES");
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_index));

  // Rank 0 creates the id NCCL's bootstrap uses to find it; the others read it from the store, whose
  // get() is bounded by the store's timeout (rendezvous() sets it to the same `timeout`).
  const std::string key = "nccl_unique_id";
  ncclUniqueId id;
  if (rank == 0) {
    const ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess)
      throw CommError(who + ": ncclGetUniqueId failed: " + detail::nccl_error(nullptr, r),
                      "rerun with NCCL_DEBUG=INFO; NCCL_SOCKET_IFNAME picks the interface NCCL's bootstrap uses");
    const auto* p = reinterpret_cast<const uint8_t*>(&id);
    store->set(key, std::vector<uint8_t>(p, p + sizeof id));
  } else {
    std::vector<uint8_t> bytes;
    try {
      bytes = store->get(key);
    } catch (const std::exception& e) {
      throw CommError(who + ": did not receive NCCL's unique id from rank 0 within " +
                          std::to_string(timeout.count() / 1000) + " s: " + e.what(),
                      "check that rank 0 started and did not fail first (see its error)");
    }
    COHORT_ASSERT(bytes.size() == sizeof id, "the NCCL unique id in the store has the wrong size");
    std::copy(bytes.begin(), bytes.end(), reinterpret_cast<uint8_t*>(&id));
  }

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // see Note [Nonblocking NCCL calls]
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&comm, size, id, rank, &config);
  if (comm) r = detail::settle(comm, r, std::chrono::steady_clock::now() + timeout, detail::sleep_for);
  if (r != ncclSuccess) {
    const std::string why = r == ncclInProgress ? "the other ranks did not all join within " + detail::seconds(timeout)
                                                : detail::nccl_error(comm, r);
    if (comm) ncclCommAbort(comm);
    throw CommError(
        who + ": NCCL could not set up its communicator on cuda:" + std::to_string(device_index) + ": " + why,
        "check that every rank was started and reached rendezvous; rerun with NCCL_DEBUG=INFO, and set "
        "NCCL_SOCKET_IFNAME if the machines have several network interfaces");
  }
  std::shared_ptr<detail::NcclState> state;
  try {
    state = std::make_shared<detail::NcclState>(rank, size, device_index, timeout, comm, store);
  } catch (...) {  // out of device memory for the barrier's buffer, say
    ncclCommAbort(comm);
    throw;
  }
  state->watchdog = std::thread([s = state.get()] { s->watch(); });
  return std::make_shared<NcclCommunicator>(std::move(state));
}

NcclCommunicator::NcclCommunicator(std::shared_ptr<detail::NcclState> state) : state_(std::move(state)) {}

NcclCommunicator::~NcclCommunicator() { state_->shutdown(); }

int NcclCommunicator::rank() const { return state_->rank; }
int NcclCommunicator::size() const { return state_->size; }
std::chrono::milliseconds NcclCommunicator::timeout() const { return state_->timeout; }

void NcclCommunicator::set_debug(bool on) { state_->debug = on; }

// Note [The NCCL communicator's flight record]
// The same record as Gloo's (comm/FlightRecorder.h), kept on the host: issued as launch() queues the
// collective on the comm stream, completed when the watchdog finds its end event done, failed when the
// communicator is aborted (a timeout, an asynchronous NCCL error) or the launch itself fails. The watchdog
// polls every 100 ms, so an end time is late by up to that much; doctor's straggler finding reads the
// issue times alone. The issue time is the host's, as c10d's Flight Recorder without timing events: a
// collective queued behind compute is "in flight" from its launch.
std::shared_ptr<comm::FlightRecorder> NcclCommunicator::flight() const { return state_->flight; }

// A host-blocking all-gather per collective: slow, as c10d's TORCH_DISTRIBUTED_DEBUG=DETAIL is, and only
// under dist.debug=detail. It goes through gather(), not all_gather(), which would check itself.
void NcclCommunicator::verify(comm::CollectiveKind kind, const at::Tensor& t, const std::string& what) {
  if (!state_->debug || state_->size == 1) return;
  const auto mine = comm::collective_signature(kind, t);
  auto all = at::zeros({state_->size, 3}, at::kLong);
  gather(all, mine, "debug check of the next collective ('" + what + "')")->wait();
  comm::check_same_collective(all, state_->rank, state_->peers->issued() + 1, what);
}

// Note [Host tensors through NCCL]
// The training loop's own collectives (metric sums, the inf/NaN flag, resource samples, shape checks)
// carry a few numbers in host tensors, and NCCL reads device memory only. Such a tensor is copied to the
// device, reduced there, and copied back when wait() returns; that wait() blocks the host (bounded by the
// timeout, like barrier's), since the caller reads the result on the host right after.
namespace {

at::Tensor on_device(const at::Tensor& t, c10::DeviceIndex device) {
  return t.defined() && t.is_cpu() ? t.to(at::Device(at::kCUDA, device)) : t;
}

HandlePtr handle_for(const std::shared_ptr<detail::NcclState>& state, std::shared_ptr<detail::NcclWork> work,
                     const at::Tensor& result, const at::Tensor& device_result) {
  const bool staged = result.defined() && result.is_cpu();
  HandlePtr h = std::make_shared<NcclHandle>(state, std::move(work), /*host_blocking=*/staged);
  if (!staged) return h;
  return then(std::move(h), [result, device_result] { result.copy_(device_result); });
}

}  // namespace

HandlePtr NcclCommunicator::all_reduce(const at::Tensor& tensor, ReduceOp op, const std::string& what) {
  verify(comm::CollectiveKind::kAllReduce, tensor, what);
  const auto t = on_device(tensor, state_->device);
  auto work = state_->launch("all_reduce", what, {t}, [&](ncclDataType_t dtype, cudaStream_t st) {
    return ncclAllReduce(t.data_ptr(), t.data_ptr(), t.numel(), dtype, detail::to_nccl(op), state_->comm, st);
  });
  return handle_for(state_, std::move(work), tensor, t);
}

HandlePtr NcclCommunicator::broadcast(const at::Tensor& tensor, int root, const std::string& what) {
  verify(comm::CollectiveKind::kBroadcast, tensor, what);
  const auto t = on_device(tensor, state_->device);
  auto work = state_->launch("broadcast", what, {t}, [&](ncclDataType_t dtype, cudaStream_t st) {
    return ncclBroadcast(t.data_ptr(), t.data_ptr(), t.numel(), dtype, root, state_->comm, st);
  });
  return handle_for(state_, std::move(work), tensor, t);
}

HandlePtr NcclCommunicator::all_gather(const at::Tensor& output, const at::Tensor& input, const std::string& what) {
  verify(comm::CollectiveKind::kAllGather, input, what);
  return gather(output, input, what);
}

HandlePtr NcclCommunicator::gather(const at::Tensor& output, const at::Tensor& input, const std::string& what) {
  COHORT_ASSERT(output.numel() == input.numel() * size() && output.scalar_type() == input.scalar_type(),
                "all_gather output must hold size() chunks of input's type");
  const auto in = on_device(input, state_->device);
  const auto out = on_device(output, state_->device);
  auto work = state_->launch("all_gather", what, {in, out}, [&](ncclDataType_t dtype, cudaStream_t st) {
    return ncclAllGather(in.data_ptr(), out.data_ptr(), in.numel(), dtype, state_->comm, st);
  });
  return handle_for(state_, std::move(work), output, out);
}

HandlePtr NcclCommunicator::reduce_scatter(const at::Tensor& output, const at::Tensor& input, ReduceOp op,
                                           const std::string& what) {
  COHORT_ASSERT(input.numel() == output.numel() * size() && output.scalar_type() == input.scalar_type(),
                "reduce_scatter input must hold size() chunks of output's type");
  verify(comm::CollectiveKind::kReduceScatter, output, what);
  // NCCL allows output == input's chunk `rank` (in place), which the Communicator contract promises. Host
  // tensors are staged separately; the copy back writes the result into the aliased chunk all the same.
  const auto in = on_device(input, state_->device);
  const auto out = on_device(output, state_->device);
  auto work = state_->launch("reduce_scatter", what, {in, out}, [&](ncclDataType_t dtype, cudaStream_t st) {
    return ncclReduceScatter(in.data_ptr(), out.data_ptr(), out.numel(), dtype, detail::to_nccl(op), state_->comm, st);
  });
  return handle_for(state_, std::move(work), output, out);
}

HandlePtr NcclCommunicator::barrier(const std::string& what) {
  verify(comm::CollectiveKind::kBarrier, at::Tensor(), what);
  const at::Tensor& buf = state_->barrier_buf;  // zeros: summing it changes nothing
  auto work = state_->launch("barrier", what, {buf}, [&](ncclDataType_t dtype, cudaStream_t st) {
    return ncclAllReduce(buf.data_ptr(), buf.data_ptr(), 1, dtype, ncclSum, state_->comm, st);
  });
  return std::make_shared<NcclHandle>(state_, std::move(work), /*host_blocking=*/true);
}

}  // namespace cohort::comm

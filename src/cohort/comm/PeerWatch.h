// What a backend's own timeout cannot say: which ranks did not arrive at a collective, and whether a
// collective differs across ranks. Used by the Gloo and the NCCL communicators alike, through the job's
// rendezvous store (see Note [Naming the ranks that did not arrive] in PeerWatch.cpp).
//
//   cohort::comm::PeerWatch watch(store, rank, size);   // starts this rank's heartbeat
//   const uint64_t seq = watch.issue();                 // before launching collective #seq
//   ... on a timeout: msg += "; " + watch.diagnose(seq);
//   // "rank(s) 2 stopped answering (no heartbeat for 2.5 s)" or "rank(s) 1 (last issued #41) never issued it"
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

namespace cohort::comm {

class PeerWatch {
 public:
  PeerWatch(c10::intrusive_ptr<c10d::Store> store, int rank, int size);
  ~PeerWatch();
  PeerWatch(const PeerWatch&) = delete;
  PeerWatch& operator=(const PeerWatch&) = delete;

  // The next collective's sequence number. Only a counter: the heartbeat publishes it each second, so
  // the collective's own path never waits on the store.
  uint64_t issue();
  uint64_t issued() const { return beat_->seq; }  // the last number issue() gave
  // Which ranks stopped beating, and which live ones never issued collective `seq`; takes 2.5 s, at
  // most 5 s (the store lives on rank 0, which may be the rank that stopped). Safe to call from any
  // thread; never throws (a failure to ask is the answer).
  std::string diagnose(uint64_t seq) const noexcept;

 private:
  // What the heartbeat thread shares with its PeerWatch. Owned by both, so that a heartbeat stuck on a
  // store that is gone can be left behind without touching freed memory (see ~PeerWatch).
  struct Beat {
    std::atomic<uint64_t> seq{0};  // collectives may be issued from autograd's threads too
    std::mutex mu;
    std::condition_variable cv;
    bool stopping = false;
    bool done = false;
  };
  static void beat(std::shared_ptr<Beat> b, c10::intrusive_ptr<c10d::Store> store, int rank);
  c10::intrusive_ptr<c10d::Store> store_;
  int rank_, size_;
  std::shared_ptr<Beat> beat_ = std::make_shared<Beat>();
  std::thread heartbeat_;
};

// Asks every rank of the job whose store this is for its flight record: each rank's heartbeat sees the
// request within about a second and writes RUN_DIR/flight/rank<R>.json (Note [Asking every rank for its
// record] in PeerWatch.cpp). Returns how many requests the job has had, this one included.
uint64_t ask_for_flight_records(c10d::Store& store);

// dist.debug=detail: the (kind, dtype, element count) of the collective a rank is about to run, which
// every rank all-gathers through its backend and compares with check_same_collective.
enum class CollectiveKind : int64_t { kAllReduce = 1, kBroadcast, kAllGather, kReduceScatter, kBarrier };
at::Tensor collective_signature(CollectiveKind kind, const at::Tensor& t);  // int64 [3], on the CPU
// `all`: the gathered signatures, int64 [size, 3] on the CPU. Throws CommError naming every rank that
// called something else, and what.
void check_same_collective(const at::Tensor& all, int rank, uint64_t seq, const std::string& what);

}  // namespace cohort::comm

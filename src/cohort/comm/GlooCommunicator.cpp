#include "cohort/comm/GlooCommunicator.h"

#include <signal.h>

#include <algorithm>
#include <memory>
#include <sstream>

#include "cohort/comm/FlightRecorder.h"
#include "cohort/comm/PeerWatch.h"
#include "cohort/comm/PieceExchange.h"
#include "cohort/util/Error.h"
#include "cohort/util/TorchCompat.h"

#ifdef COHORT_HAVE_GLOO
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif

namespace cohort::comm {

#ifdef COHORT_HAVE_GLOO
namespace {

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return c10d::ReduceOp::SUM;
    case ReduceOp::kMax: return c10d::ReduceOp::MAX;
    case ReduceOp::kMin: return c10d::ReduceOp::MIN;
  }
  return c10d::ReduceOp::SUM;
}

std::string other_ranks(int rank, int size) {
  std::ostringstream os;
  os << "{";
  bool first = true;
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    os << (first ? "" : ",") << r;
    first = false;
  }
  os << "}";
  return os.str();
}

// Reduces the rows of `rows` (one per rank) in rank order into `out`, in fp32 for 16-bit floats: the same
// bits on every rank and every run.
void reduce_rows_into(const at::Tensor& rows, ReduceOp op, const at::Tensor& out) {
  const bool widen = rows.scalar_type() == at::kBFloat16 || rows.scalar_type() == at::kHalf;
  at::Tensor r = widen ? rows[0].to(at::kFloat) : rows[0].clone();
  for (int64_t k = 1; k < rows.size(0); ++k) {
    auto c = widen ? rows[k].to(at::kFloat) : rows[k];
    if (op == ReduceOp::kSum)
      r.add_(c);
    else
      r = op == ReduceOp::kMax ? at::maximum(r, c) : at::minimum(r, c);
  }
  out.view(-1).copy_(r);
}

// Identifies one collective in error messages: kind, purpose, sequence number, rank and peers.
struct Context {
  std::string kind;
  std::string what;
  uint64_t seq;
  int rank;
  int size;
  std::chrono::milliseconds timeout;
  // Asked after a failure which ranks stopped or never issued this collective (see Note [Naming the ranks
  // that did not arrive]); shared, since a pending handle may outlive its communicator.
  std::shared_ptr<const comm::PeerWatch> watch;
  std::shared_ptr<comm::FlightRecorder> flight;  // this collective's record, ended by wait()

  std::string describe() const {
    std::ostringstream os;
    os << kind << " '" << what << "' (collective #" << seq << ") on rank " << rank << " of " << size;
    return os.str();
  }
};

// Note [Reduce-scatter and all-gather in pieces on LibTorch 1.13]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// LibTorch 1.13's Gloo process group has no reduce-scatter, and Gloo's TCP transport moves one large
// message each way on a pair at about half the link's rate, where two or more in flight reach it (32 MiB each
// way over 1 Gbit/s: 548 ms as one send/recv, 285 ms as two pieces; an all-to-all took 566 ms; docs/scaling.md).
// So on 1.13 a reduce-scatter is a direct exchange: rank r sends chunk j of its input to rank j in pieces of
// at most 1 MiB, all issued at once through send/recv, and sums what arrives in rank order, so its bits do
// not change. It moves what a ring moves. An all-gather (and the bf16 all-reduce, which is one) takes the same
// exchange on two ranks, where Gloo's ring sends both ways on the one pair; from three ranks on each pair of
// the ring carries one direction, and the ring was as fast or faster, so it stays Gloo's. Each rank posts
// all its receives before its first send. A Gloo send writes its payload once the peer's note that its
// receive is posted arrives, and a receive posted after a send queues that note behind the send's payload
// on the pair's one stream: when both ends of a pair sent first, Gloo carried a message of up to about
// 64 KiB one direction at a time (32 KiB each way over 100 Mbit/s: 3.06 ms, against 1.82 with
// the receives first and 1.68 one way, PyTorch 2.14's Gloo). On 2 ranks over 100 Mbit/s that took this
// reduce-scatter of 256 KiB from 12.2 to 13.8 ms to 11.0, and of 64 KiB from 2.7 to 3.1 to 2.6
// (docs/scaling.md, "A cost model"). A send/recv work
// learns that it finished only inside wait(), so a thread per communicator waits on the pieces and marks
// the exchange done: a caller polling is_completed() (ddp's buckets, optim.in_backward) sees it end.
class GlooHandle : public Handle {
 public:
  GlooHandle(util::compat::WorkPtr work, Context ctx, std::function<void()> on_done = {})
      : work_(std::move(work)), ctx_(std::move(ctx)), on_done_(std::move(on_done)) {}
  GlooHandle(std::shared_ptr<PieceExchange> exchange, Context ctx, std::function<void()> on_done = {})
      : exchange_(std::move(exchange)), ctx_(std::move(ctx)), on_done_(std::move(on_done)) {}

  void wait() override {
    if (done_) return;
    const CollectiveWaitTimer blocked;
    try {
      // Gloo enforces the same timeout inside the collective, so a dead peer cannot block this wait
      // (or Gloo's worker thread) forever.
      if (work_)
        work_->wait(ctx_.timeout);
      else
        exchange_->wait();
    } catch (const std::exception& e) {
      const std::string msg = e.what();
      const bool timed_out = msg.find("imed out") != std::string::npos || msg.find("imeout") != std::string::npos;
      std::ostringstream os;
      os << ctx_.describe() << (timed_out ? " timed out after " : " failed (timeout ") << ctx_.timeout.count() / 1000.0
         << " s" << (timed_out ? "" : ")") << ": ranks " << other_ranks(ctx_.rank, ctx_.size) << " did not complete it";
      // Asked on a broken connection too, not only on a timeout: a peer whose timer fired first exits,
      // so a rank whose own timer had not yet fired sees "connection closed" from that peer, and only the
      // heartbeats still say who is really gone.
      if (ctx_.flight) ctx_.flight->ended(ctx_.seq, false);
      if (ctx_.watch) os << "; " << ctx_.watch->diagnose(ctx_.seq);
      os << ". Gloo said: " << first_line(msg);
      throw CommError(os.str(), timed_out ? "a peer rank died, stalled or called a different collective; "
                                            "check the other ranks' errors, or raise dist.timeout_s"
                                          : "a peer rank exited or its connection broke; check its error");
    }
    if (ctx_.flight) ctx_.flight->ended(ctx_.seq, true);
    if (on_done_) on_done_();
    done_ = true;
  }

  bool is_completed() override { return done_ || (work_ ? work_->isCompleted() : exchange_->done()); }

 private:
  static std::string first_line(const std::string& s) {
    const auto nl = s.find('\n');
    return nl == std::string::npos ? s : s.substr(0, nl);
  }

  util::compat::WorkPtr work_;
  std::shared_ptr<PieceExchange> exchange_;  // instead of work_ for the pieces of an exchange (the Note above)
  Context ctx_;
  std::function<void()> on_done_;
  bool done_ = false;
};

class GlooCommunicatorImpl : public Communicator {
 public:
  GlooCommunicatorImpl(c10::intrusive_ptr<c10d::ProcessGroupGloo> pg, c10::intrusive_ptr<c10d::Store> store, int rank,
                       int size, std::chrono::milliseconds timeout)
      : pg_(std::move(pg)),
        rank_(rank),
        size_(size),
        timeout_(timeout),
        watch_(std::make_shared<comm::PeerWatch>(std::move(store), rank, size)) {}

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend_name() const override { return "gloo"; }
  std::chrono::milliseconds timeout() const override { return timeout_; }

  void set_debug(bool on) override { debug_ = on; }
  std::shared_ptr<comm::FlightRecorder> flight() const override { return flight_; }

  HandlePtr all_reduce(const at::Tensor& tensor, ReduceOp op, const std::string& what) override {
    verify(Kind::kAllReduce, tensor, what);
    if (tensor.scalar_type() == at::kBFloat16) return all_reduce_bf16(tensor, op, what);
    std::vector<at::Tensor> ts{tensor};
    c10d::AllreduceOptions opts;
    opts.reduceOp = to_c10d(op);
    opts.timeout = timeout_;
    return std::make_shared<GlooHandle>(pg_->allreduce(ts, opts), context("all_reduce", what, tensor));
  }

  HandlePtr broadcast(const at::Tensor& tensor, int root, const std::string& what) override {
    verify(Kind::kBroadcast, tensor, what);
    std::vector<at::Tensor> ts{tensor};
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    opts.timeout = timeout_;
    return std::make_shared<GlooHandle>(pg_->broadcast(ts, opts), context("broadcast", what, tensor));
  }

  HandlePtr all_gather(const at::Tensor& output, const at::Tensor& input, const std::string& what) override {
    verify(Kind::kAllGather, input, what);
    COHORT_ASSERT(output.numel() == input.numel() * size_, "all_gather output must hold size() chunks");
    if constexpr (util::compat::kGlooHasFlatCollectives) {
      if (output.is_contiguous()) {
        auto flat_out = output.view(-1);
        auto flat_in = input.reshape(-1).contiguous();
        c10d::AllgatherOptions opts;
        opts.timeout = timeout_;
        return std::make_shared<GlooHandle>(pg_->_allgather_base(flat_out, flat_in, opts),
                                            context("all_gather", what, output));
      }
    }
    const int64_t n = input.numel();
    // LibTorch 1.13, two ranks: Note [Reduce-scatter and all-gather in pieces on LibTorch 1.13].
    if (size_ == 2 && output.is_contiguous()) {
      auto flat_out = output.view(-1);
      flat_out.narrow(0, rank_ * n, n).copy_(input.reshape(-1));
      auto exchange = exchange_chunks(flat_out, flat_out, n, /*send_own_only=*/true);
      return std::make_shared<GlooHandle>(exchange, context("all_gather", what, output));
    }
    std::vector<std::vector<at::Tensor>> outs(1);
    for (int r = 0; r < size_; ++r) outs[0].push_back(output.view(-1).narrow(0, r * n, n));
    std::vector<at::Tensor> ins{input.reshape(-1)};
    c10d::AllgatherOptions opts;
    opts.timeout = timeout_;
    return std::make_shared<GlooHandle>(pg_->allgather(outs, ins, opts), context("all_gather", what, output));
  }

  HandlePtr reduce_scatter(const at::Tensor& output, const at::Tensor& input, ReduceOp op,
                           const std::string& what) override {
    verify(Kind::kReduceScatter, output, what);
    COHORT_ASSERT(input.numel() == output.numel() * size_, "reduce_scatter input must hold size() chunks");
    const bool sixteen_bit = input.scalar_type() == at::kBFloat16 || input.scalar_type() == at::kHalf;
    if constexpr (util::compat::kGlooHasFlatCollectives) {
      // LibTorch 2.x's Gloo reduce-scatter is an all-reduce of a copy of the whole buffer, then a copy
      // of this rank's chunk, wrapped in a work that does both inside wait(): its isCompleted() stays
      // false until then, so a rank could never see it end while backward goes on (optim.in_backward),
      // and its wait ignores the timeout. We issue the same all-reduce ourselves (the same bits), whose
      // work ends on Gloo's thread, and copy the chunk out in our wait(). 16-bit floats take the path
      // below, which sums them in fp32.
      if (!sixteen_bit && output.is_contiguous()) {
        std::vector<at::Tensor> whole{input.reshape(-1).clone()};
        c10d::AllreduceOptions opts;
        opts.reduceOp = to_c10d(op);
        opts.timeout = timeout_;
        auto work = pg_->allreduce(whole, opts);
        const int64_t n = output.numel(), offset = n * rank_;
        return std::make_shared<GlooHandle>(
            work, context("reduce_scatter", what, input),
            [whole = whole[0], out = output, n, offset]() mutable { out.view(-1).copy_(whole.narrow(0, offset, n)); });
      }
    }
    // LibTorch 1.13: see Note [Reduce-scatter and all-gather in pieces on LibTorch 1.13]. Rank r receives
    // chunk r of every rank into row k of `recv` (its own chunk stays in row r) and sums the rows here in
    // rank order, so the result is the same bits on every run. 16-bit floats are widened for the sum.
    const int64_t n = output.numel();
    auto send = input.reshape(-1).contiguous();
    auto recv = at::empty_like(send);
    recv.narrow(0, rank_ * n, n).copy_(send.narrow(0, rank_ * n, n));
    auto exchange = exchange_chunks(send, recv, n);
    return std::make_shared<GlooHandle>(exchange, context("reduce_scatter", what, input),
                                        [recv, out = output, n, world = size_, op] {
                                          reduce_rows_into(recv.view({world, n}), op, out);
                                        });
  }

  // Gloo's all-reduce has no bfloat16 type (c10d's Gloo process group rejects it: "Invalid scalar
  // type"), and its all-gather none for int16. The 16-bit payload is all-gathered under float16's type
  // instead (an all-gather only copies bytes, so the bits arrive untouched) and reduced here in float32, in rank
  // order, so every rank gets the same bits. Each rank sends (W-1) x N values instead of a ring
  // all-reduce's 2 (W-1)/W x N: the same for two ranks, W/2 times as many for W.
  HandlePtr all_reduce_bf16(const at::Tensor& tensor, ReduceOp op, const std::string& what) {
    COHORT_ASSERT(tensor.is_contiguous(), "bfloat16 all_reduce needs a contiguous tensor");
    const int64_t n = tensor.numel();
    auto bits = tensor.view(-1).view(at::kHalf);
    auto gathered = at::empty({size_ * n}, bits.options());
    auto done = [gathered, out = tensor, n, op, world = size_] {
      reduce_rows_into(gathered.view(at::kBFloat16).view({world, n}), op, out);
    };
    if (size_ == 2) {  // Note [Reduce-scatter and all-gather in pieces on LibTorch 1.13]
      gathered.narrow(0, rank_ * n, n).copy_(bits);
      return std::make_shared<GlooHandle>(exchange_chunks(gathered, gathered, n, true),
                                          context("all_reduce", what, tensor), done);
    }
    std::vector<std::vector<at::Tensor>> outs(1);
    for (int r = 0; r < size_; ++r) outs[0].push_back(gathered.narrow(0, r * n, n));
    std::vector<at::Tensor> ins{bits};
    c10d::AllgatherOptions opts;
    opts.timeout = timeout_;
    return std::make_shared<GlooHandle>(pg_->allgather(outs, ins, opts), context("all_reduce", what, tensor), done);
  }

  HandlePtr barrier(const std::string& what) override {
    verify(Kind::kBarrier, at::Tensor(), what);
    c10d::BarrierOptions opts;
    opts.timeout = timeout_;
    return std::make_shared<GlooHandle>(pg_->barrier(opts), context("barrier", what));
  }

 private:
  using Kind = comm::CollectiveKind;

  // See Communicator::set_debug. Each rank's (kind, dtype, element count) is all-gathered through the
  // process group directly (not through our own collectives, which would check themselves) and compared.
  void verify(Kind kind, const at::Tensor& t, const std::string& what) {
    if (!debug_ || size_ == 1) return;
    auto mine = comm::collective_signature(kind, t);
    auto all = at::zeros({size_, 3}, at::kLong);
    std::vector<std::vector<at::Tensor>> outs(1);
    for (int r = 0; r < size_; ++r) outs[0].push_back(all[r]);
    std::vector<at::Tensor> ins{mine};
    c10d::AllgatherOptions opts;
    opts.timeout = timeout_;
    GlooHandle(pg_->allgather(outs, ins, opts), context("debug check of the next collective", what)).wait();
    comm::check_same_collective(all, rank_, watch_->issued() + 1, what);
  }

  // Sends `send`'s chunk j (chunk rank_ for every j when `send_own_only`) to rank j and receives rank j's
  // into `recv`'s chunk j, chunks of n elements, in pieces issued at once (the Note above). Every rank
  // numbers its exchanges alike, since collectives are issued in the same order, and tags each piece with
  // that number, so the pieces of two exchanges in flight together never meet.
  std::shared_ptr<PieceExchange> exchange_chunks(const at::Tensor& send, const at::Tensor& recv, int64_t n,
                                                 bool send_own_only = false) {
    const int64_t item = send.element_size();
    const int64_t piece_bytes = std::clamp<int64_t>(n * item / 4, int64_t{64} << 10, int64_t{1} << 20);
    const int64_t piece = std::max<int64_t>(1, std::max(piece_bytes / item, (n + kMaxPieces - 1) / kMaxPieces));
    const int base = (1 << 30) | static_cast<int>((exchanges_++ & 0xffff) << 13);
    auto e = std::make_shared<PieceExchange>();
    e->timeout = timeout_;
    // Every receive is posted before any send: a Gloo pair whose two ends each send before they receive
    // carries a small message one direction at a time (the Note above).
    for (const bool sending : {false, true}) {
      for (int i = 1; i < size_; ++i) {
        const int to = (rank_ + i) % size_, from = (rank_ - i + size_) % size_;
        const int64_t out_chunk = send_own_only ? rank_ : to;
        for (int64_t offset = 0, k = 0; offset < n; offset += piece, ++k) {
          const int64_t len = std::min(piece, n - offset);
          const int tag = base + static_cast<int>(k);
          if (sending) {
            std::vector<at::Tensor> out{send.narrow(0, out_chunk * n + offset, len)};
            e->works.push_back(pg_->send(out, to, tag));
          } else {
            std::vector<at::Tensor> in{recv.narrow(0, from * n + offset, len)};
            e->works.push_back(pg_->recv(in, from, tag));
          }
        }
      }
    }
    if (!waiter_) waiter_ = std::make_unique<ExchangeWaiter>();
    waiter_->add(e);
    return e;
  }
  static constexpr int64_t kMaxPieces = 1 << 13;  // a piece's index fits the tag's low 13 bits

  // See Note [Naming the ranks that did not arrive] in comm/PeerWatch.cpp.
  // Every collective is numbered here and recorded in the flight recorder (comm/FlightRecorder.h).
  Context context(const char* kind, const std::string& what, const at::Tensor& t = {}) {
    const uint64_t seq = watch_->issue();
    flight_->issued(seq, kind, what, t);
    return Context{kind, what, seq, rank_, size_, timeout_, watch_, flight_};
  }

  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg_;
  int rank_;
  int size_;
  std::chrono::milliseconds timeout_;
  bool debug_ = false;
  std::shared_ptr<comm::PeerWatch> watch_;  // shared with pending handles' diagnosis
  std::shared_ptr<comm::FlightRecorder> flight_ = std::make_shared<comm::FlightRecorder>();
  std::unique_ptr<ExchangeWaiter> waiter_;  // made by the first exchange
  uint32_t exchanges_ = 0;
};

}  // namespace

// Note [A write to a dead rank must not kill this one]
// Gloo writes to its sockets with writev, which has no MSG_NOSIGNAL, and handles EPIPE as a closed
// connection. That relies on SIGPIPE being ignored, as Python does for PyTorch. A C++ program keeps the
// default, which ends the process: a rank that wrote to a rank that had just died was killed without a
// word (seen once in make test: Failures.ABrokenConnectionStillNamesTheRankThatIsGone, where rank 0 must
// name the dead rank and instead vanished at its next step). So before the first Gloo pair is made,
// SIGPIPE gets a handler that does nothing, unless the program chose its own: the write then fails with
// EPIPE, and the peer watch names the rank that is gone. A handler rather than SIG_IGN, because a handler
// is reset by exec: programs this one starts keep the default.
namespace {
void keep_sigpipe_from_killing() {
  struct sigaction current {};
  if (sigaction(SIGPIPE, nullptr, &current) != 0 || current.sa_handler != SIG_DFL) return;
  struct sigaction quiet {};
  quiet.sa_handler = [](int) {};
  sigemptyset(&quiet.sa_mask);
  sigaction(SIGPIPE, &quiet, nullptr);
}
}  // namespace

CommunicatorPtr GlooCommunicator::create(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                         const std::string& local_address, std::chrono::milliseconds timeout,
                                         int threads) {
  keep_sigpipe_from_killing();
  auto opts = c10d::ProcessGroupGloo::Options::create();
  opts->timeout = timeout;
  try {
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(local_address));
  } catch (const std::exception& e) {
    throw CommError(
        "rank " + std::to_string(rank) + ": cannot use address '" + local_address + "' for Gloo: " + e.what(),
        "set COHORT_SOCKET_IFNAME (or GLOO_SOCKET_IFNAME) to the network interface that reaches "
        "the other machines");
  }
  // Two by default: DDP keeps at most a few buckets in flight, and on a small machine every extra Gloo
  // thread competes with compute for a core. One under optim.in_backward (rendezvous's caller decides).
  opts->threads = threads;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg;
  try {
    pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, opts);
  } catch (const std::exception& e) {
    throw CommError("rank " + std::to_string(rank) + " of " + std::to_string(size) +
                        ": Gloo could not connect to the other ranks within " + std::to_string(timeout.count() / 1000) +
                        " s: " + e.what(),
                    "check that every rank was started and can reach this machine; raise dist.timeout_s "
                    "for slow starts");
  }
  return std::make_shared<GlooCommunicatorImpl>(std::move(pg), store, rank, size, timeout);
}

#else

CommunicatorPtr GlooCommunicator::create(const c10::intrusive_ptr<c10d::Store>&, int rank, int, const std::string&,
                                         std::chrono::milliseconds, int) {
  throw CommError("rank " + std::to_string(rank) +
                      ": dist.backend=gloo is not available: this cohort was built "
                      "without gloo's headers",
                  "install libgloo-dev and rebuild, or use dist.backend=nccl on GPUs");
}

#endif

}  // namespace cohort::comm

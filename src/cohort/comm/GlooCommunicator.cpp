#include "cohort/comm/GlooCommunicator.h"

#include <memory>
#include <sstream>

#include "cohort/comm/FlightRecorder.h"
#include "cohort/comm/PeerWatch.h"
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

class GlooHandle : public Handle {
 public:
  GlooHandle(util::compat::WorkPtr work, Context ctx, std::function<void()> on_done = {})
      : work_(std::move(work)), ctx_(std::move(ctx)), on_done_(std::move(on_done)) {}

  void wait() override {
    if (done_) return;
    const CollectiveWaitTimer blocked;
    try {
      // Gloo enforces the same timeout inside the collective, so a dead peer cannot block this wait
      // (or Gloo's worker thread) forever.
      work_->wait(ctx_.timeout);
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

  bool is_completed() override { return done_ || work_->isCompleted(); }

 private:
  static std::string first_line(const std::string& s) {
    const auto nl = s.find('\n');
    return nl == std::string::npos ? s : s.substr(0, nl);
  }

  util::compat::WorkPtr work_;
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
    std::vector<std::vector<at::Tensor>> outs(1);
    for (int r = 0; r < size_; ++r) outs[0].push_back(output.view(-1).narrow(0, r * input.numel(), input.numel()));
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
    // c10d's Gloo process group in LibTorch 1.13 has no reduce_scatter (FACTS.md). An all-to-all moves
    // exactly what a ring reduce-scatter moves, (W-1)/W of the buffer per rank: rank r receives chunk r
    // of every rank, and sums them here in rank order, so the result is the same bits on every run.
    // Gloo's all-to-all only copies bytes, so 16-bit floats travel under one 16-bit type.
    const int64_t n = output.numel();
    const bool bits16 = input.scalar_type() == at::kBFloat16;
    auto send = input.reshape(-1).contiguous();
    if (bits16) send = send.view(at::kHalf);
    auto recv = at::empty_like(send);
    std::vector<int64_t> equal_split;
    c10d::AllToAllOptions opts;
    opts.timeout = timeout_;
    auto work = pg_->alltoall_base(recv, send, equal_split, equal_split, opts);
    auto out = output;
    const int world = size_;
    const auto dtype = input.scalar_type();
    return std::make_shared<GlooHandle>(work, context("reduce_scatter", what, input),
                                        [recv, send, out, n, world, op, bits16, dtype]() mutable {
                                          auto chunks = (bits16 ? recv.view(dtype) : recv).view({world, n});
                                          const bool widen = dtype == at::kBFloat16 || dtype == at::kHalf;
                                          at::Tensor r = widen ? chunks[0].to(at::kFloat) : chunks[0].clone();
                                          for (int k = 1; k < world; ++k) {
                                            auto c = widen ? chunks[k].to(at::kFloat) : chunks[k];
                                            if (op == ReduceOp::kSum)
                                              r.add_(c);
                                            else if (op == ReduceOp::kMax)
                                              r = at::maximum(r, c);
                                            else
                                              r = at::minimum(r, c);
                                          }
                                          out.view(-1).copy_(r);
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
    std::vector<std::vector<at::Tensor>> outs(1);
    for (int r = 0; r < size_; ++r) outs[0].push_back(gathered.narrow(0, r * n, n));
    std::vector<at::Tensor> ins{bits};
    c10d::AllgatherOptions opts;
    opts.timeout = timeout_;
    auto out = tensor;
    return std::make_shared<GlooHandle>(pg_->allgather(outs, ins, opts), context("all_reduce", what, tensor),
                                        [gathered, out, n, op, this]() mutable {
                                          auto all = gathered.view(at::kBFloat16).view({size_, n}).to(at::kFloat);
                                          at::Tensor r = all[0].clone();
                                          for (int k = 1; k < size_; ++k) {
                                            if (op == ReduceOp::kSum)
                                              r.add_(all[k]);
                                            else if (op == ReduceOp::kMax)
                                              r = at::maximum(r, all[k]);
                                            else
                                              r = at::minimum(r, all[k]);
                                          }
                                          out.view(-1).copy_(r);
                                        });
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
};

}  // namespace

CommunicatorPtr GlooCommunicator::create(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                         const std::string& local_address, std::chrono::milliseconds timeout,
                                         int threads) {
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

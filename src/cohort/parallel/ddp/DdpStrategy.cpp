#include "cohort/parallel/ddp/DdpStrategy.h"

#include <chrono>
#include <cmath>
#include <map>

#include "cohort/amp/GradScaler.h"
#include "cohort/amp/MasterWeights.h"
#include "cohort/parallel/ddp/DistributedDataParallel.h"
#include "cohort/util/Error.h"

namespace cohort::parallel::ddp {
namespace {

// torch.nn.utils.clip_grad_norm_: scale every gradient by max_norm / (norm + 1e-6) when that is below 1.
double clip_full_gradients(const std::vector<at::Tensor>& params, double clip_norm) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> grads;
  for (const auto& p : params) grads.push_back(p.grad());
  const double norm = std::sqrt(squared_sum(grads).item<double>());
  const double coef = clip_norm / (norm + 1e-6);
  if (coef < 1)
    for (const auto& p : params)
      if (p.grad().defined()) p.grad().mul_(coef);
  return norm;
}

// Note [The optimizer inside backward]
// With optim.in_backward=true (ddp, more than one rank), each gradient bucket's parameters are stepped as
// soon as the bucket's all-reduce has ended, while backward goes on, as PyTorch DDP's fused optimizer
// (_register_fused_optim) does. The reducer tells the strategy when a bucket's averaged gradients are in
// .grad (Reducer::set_on_bucket_reduced); the strategy then updates exactly those parameters
// (Optimizer::update). Design documents' "bonus optimization": the optimizer's time hides behind the
// communication of the later buckets.
// - Same numbers: SGD and AdamW update each element from its own gradient and state, so stepping bucket
//   by bucket gives every parameter the update a whole step gives it (AdamW counts one step, at the
//   first bucket). Parity tests: tests/unit/parallel/test_in_backward.cpp.
// - When: a bucket is finished during backward once its collective is done, else at backward's end; in
//   bucket order, the same on every rank. A hook whose wait issues collectives (PowerSGD) is finished
//   only at the end, where every rank waits in the same order.
// - What stays exposed: a bucket's step hides behind the reduction of the buckets after it, so the
//   last bucket's step hides behind nothing. Under in_backward the last bucket is by default as small as
//   the first (dist.last_bucket_mb): the first parameters in registration order, whose gradients come
//   last (plan_buckets). Another bucketing sums in another order in a ring of 3 or more ranks, so runs
//   with and without in_backward agree to rounding there, and bitwise with the same dist.last_bucket_mb.
//   figures() reports the seconds of bucket steps that did and did not overlap a later reduction.
// - One collective at a time: with Gloo's default two threads, two buckets share the link and finish
//   together near the end, and their steps then overlap nothing. With one thread (Setup.cpp's join_world)
//   each bucket finishes at the link's full rate while the next one is sent. ResNet-50, AdamW, 1 Gbit/s
//   netns link (bench/in_backward.py): 76% of the optimizer time hidden with two threads, 98% with one,
//   and the plain step as fast (docs/optimizer.md).
// - The learning rate is needed before backward: the loop calls prepare_step() before the last
//   micro-batch's backward. Without it (or at world size 1, where there is no communication to hide),
//   step() steps as always. Gradient accumulation steps on the last micro-batch only, the one that
//   synchronizes.
// - A parameter moves only after its bucket's gradients are complete, so backward no longer needs its
//   value: every node that used it has run (as with torch's _apply_optimizer_in_backward).
// - What cannot combine is refused in Config.cpp's validate: clipping by the global norm and fp16 loss
//   scaling need every gradient before any parameter moves; the swarm and DiLoCo step on their own
//   schedule.
// - zero1, zero2 and fsdp step each unit's slice as its reduce-scatter ends instead: Note [Sharded
//   steps inside backward] in shard/ShardedStrategy.cpp.
// - Divergence: each bucket is checked for inf/NaN before it is stepped (the averaged gradients are the
//   same on every rank, so every rank stops at the same bucket). The buckets before it have moved, and
//   StepResult::updated_in_backward says so; the loop then stops without saving, as it does for any
//   non-finite gradient in fp32 or bf16.
class DdpStrategy : public Strategy {
 public:
  DdpStrategy(std::shared_ptr<torch::nn::Module> model, comm::CommunicatorPtr comm, DdpOptions opts,
              std::shared_ptr<CommHook> hook)
      : model_(model), comm_(comm), ddp_(std::move(model), std::move(comm), opts) {
    ddp_.set_comm_hook(std::move(hook));
  }
  std::string name() const override { return "ddp"; }
  void build_optimizer(const OptimConfig& cfg) override {
    // After wrapping, so the masters copy rank 0's weights. With fp32 parameters the masters are the
    // parameters themselves and nothing below changes.
    masters_ = amp::MasterWeights(model_->named_parameters());
    optimizer_ = optim::make_optimizer(cfg, optim::split_groups(masters_.optimizer_params(), group_rule(cfg)));
    if (cfg.in_backward && comm_->size() > 1) start_stepping_in_backward();
  }
  void freeze(const std::string& name) override { optimizer_->freeze(name); }
  std::shared_ptr<void> gradient_sync(bool enabled) override {
    if (enabled) return nullptr;
    return std::make_shared<DistributedDataParallel::NoSync>(ddp_.no_sync());
  }
  void prepare_step(double lr, const StepOptions& o) override {
    if (bucket_members_.empty()) return;
    optimizer_->set_momentum(o.momentum);
    in_backward_ = InBackward{};
    in_backward_.armed = true;
    in_backward_.lr = lr;
  }
  StepResult step(double lr, const StepOptions& o) override {
    const InBackward done = in_backward_;
    in_backward_ = InBackward{};
    if (done.buckets_stepped > 0 || done.nonfinite) {
      StepResult r;
      r.nonfinite = done.nonfinite;
      r.updated_in_backward = done.nonfinite && done.buckets_stepped > 0;
      optimizer_->zero_grad();
      return r;
    }
    return step_after_backward(lr, o);
  }
  // Under optim.in_backward: how many buckets of the last backward were stepped before it ended (the
  // others at its end), and the seconds of bucket steps since the start that overlapped a later bucket's
  // reduction (hidden) or did not (exposed, an upper bound).
  std::vector<std::pair<std::string, double>> figures() const override {
    if (bucket_members_.empty()) return {};
    return {{"in_backward_early_buckets", static_cast<double>(ddp_.reducer().last_trace().finished_in_backward)},
            {"in_backward_hidden_seconds", hidden_seconds_},
            {"in_backward_exposed_seconds", exposed_seconds_}};
  }
  SyncBytes last_sync_bytes() const override {
    const auto& t = ddp_.reducer().last_trace();
    return {t.bytes_reduced, t.bytes_dense};
  }
  StateBytes state_bytes() const override {
    StateBytes b;
    for (const auto& p : model_->parameters()) b.params += p.numel() * static_cast<int64_t>(p.element_size());
    // The reducer's buckets hold a full copy of the gradients on top of each parameter's own .grad.
    for (const auto& bucket : ddp_.reducer().plan()) b.grads += bucket.numel * c10::elementSize(bucket.dtype);
    for (const auto& p : model_->parameters())
      if (p.grad().defined()) b.grads += p.numel() * static_cast<int64_t>(p.element_size());
    // fp32 master weights count as optimizer state, as the ZeRO paper's 12 bytes per parameter do.
    b.optimizer = (optimizer_ ? optimizer_->state_bytes() : 0) + masters_.bytes();
    return b;
  }
  StrategyState save_state() override {
    StrategyState out;
    out.optimizer = optimizer_->state_dict();
    for (auto& entry : masters_.state_dict()) out.optimizer.push_back(std::move(entry));
    out.resume = ddp_.reducer().comm_hook().state_dict(ddp_.reducer().communicator());
    return out;
  }
  void load_state(const optim::NamedState& optimizer, const checkpoint::NamedTensors& resume) override {
    optimizer_->load_state_dict(masters_.load_state_dict(optimizer));
    ddp_.reducer().comm_hook().load_state_dict(resume, ddp_.reducer().communicator());
  }

 private:
  // What the backward under way has stepped (Note [The optimizer inside backward]).
  struct InBackward {
    bool armed = false;  // prepare_step() gave this step's learning rate
    double lr = 0;
    int64_t buckets_stepped = 0;
    bool nonfinite = false;  // a bucket held inf or NaN: it and the later ones were not stepped
  };

  StepResult step_after_backward(double lr, const StepOptions& o) {
    // Gradients are already averaged and identical on every rank (an inf anywhere is an inf in the
    // sum), so each rank's check and norm are the global ones, without communication.
    // With loss scaling each rank also agrees explicitly: a flag reduced across ranks, not the averaged
    // gradients alone, decides the skip (see Note [Every rank skips an overflowed step together]).
    masters_.grads_to_master();
    std::vector<at::Tensor> params, grads;
    for (const auto& g : optimizer_->groups()) params.insert(params.end(), g.params.begin(), g.params.end());
    for (const auto& p : params) grads.push_back(p.grad());
    StepResult r;
    r.nonfinite = amp::unscale_and_check(grads, 1.0 / o.loss_scale);
    if (o.skip_nonfinite && comm_->size() > 1) {
      auto flag = at::full({1}, r.nonfinite ? 1.0 : 0.0, at::kDouble);
      comm_->all_reduce(flag, comm::ReduceOp::kMax, "inf/NaN gradient flag")->wait();
      r.nonfinite = flag.item<double>() > 0;
    }
    if (o.clip_norm > 0 && !r.nonfinite) r.grad_norm = clip_full_gradients(params, o.clip_norm);
    r.skipped = r.nonfinite && o.skip_nonfinite;
    if (!r.skipped) {
      optimizer_->set_momentum(o.momentum);
      optimizer_->step(lr);
      masters_.master_to_model();
    }
    optimizer_->zero_grad();
    masters_.zero_model_grads();
    return r;
  }

  // Which optimizer parameters (per group, by index) each reducer bucket holds, matched by name.
  void start_stepping_in_backward() {
    COHORT_ASSERT(masters_.bytes() == 0, "optim.in_backward with fp16 master weights (Config.cpp refuses it)");
    std::map<std::string, std::pair<size_t, size_t>> where;
    const auto& groups = optimizer_->groups();
    for (size_t gi = 0; gi < groups.size(); ++gi)
      for (size_t i = 0; i < groups[gi].names.size(); ++i) where[groups[gi].names[i]] = {gi, i};
    const auto& names = ddp_.parameter_names();
    for (const auto& bucket : ddp_.reducer().plan()) {
      std::vector<std::vector<size_t>> members(groups.size());
      for (size_t index : bucket.params)
        if (const auto it = where.find(names[index]); it != where.end())
          members[it->second.first].push_back(it->second.second);
      bucket_members_.push_back(std::move(members));
    }
    ddp_.reducer().set_on_bucket_reduced([this](size_t b) { step_bucket(b); });
  }

  void step_bucket(size_t b) {
    auto& s = in_backward_;
    if (!s.armed || s.nonfinite) return;
    std::vector<at::Tensor> grads;
    const auto& groups = optimizer_->groups();
    for (size_t gi = 0; gi < groups.size(); ++gi)
      for (size_t i : bucket_members_[b][gi]) grads.push_back(groups[gi].params[i].grad());
    if (amp::unscale_and_check(grads, 1.0)) {
      s.nonfinite = true;
      return;
    }
    const auto t0 = std::chrono::steady_clock::now();
    if (s.buckets_stepped == 0) optimizer_->begin_step();
    optimizer_->update(s.lr, bucket_members_[b]);
    ++s.buckets_stepped;
    // Hidden when a later bucket was still being reduced (or not yet produced) when this step ended:
    // the step was not on the critical path. Else counted whole as exposed, an upper bound.
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    (ddp_.reducer().reducing_after(b) ? hidden_seconds_ : exposed_seconds_) += took;
  }

  std::shared_ptr<torch::nn::Module> model_;
  comm::CommunicatorPtr comm_;
  DistributedDataParallel ddp_;
  amp::MasterWeights masters_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  std::vector<std::vector<std::vector<size_t>>> bucket_members_;  // [bucket][group] -> parameter indices
  InBackward in_backward_;
  double hidden_seconds_ = 0, exposed_seconds_ = 0;  // bucket steps in backward since the start
};

}  // namespace

std::unique_ptr<Strategy> make_ddp_strategy(std::shared_ptr<torch::nn::Module> model, comm::CommunicatorPtr comm,
                                            const DdpOptions& options, std::shared_ptr<CommHook> hook) {
  return std::make_unique<DdpStrategy>(std::move(model), std::move(comm), options, std::move(hook));
}

}  // namespace cohort::parallel::ddp

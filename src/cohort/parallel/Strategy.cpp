#include "cohort/parallel/Strategy.h"

#include <cmath>

#include "cohort/amp/GradScaler.h"
#include "cohort/amp/MasterWeights.h"
#include "cohort/models/Models.h"
#include "cohort/parallel/compress/LowPrecisionHook.h"
#include "cohort/parallel/compress/PowerSgd.h"
#include "cohort/parallel/ddp/CommHook.h"
#include "cohort/parallel/ddp/DistributedDataParallel.h"
#include "cohort/parallel/shard/ShardedStrategy.h"
#include "cohort/parallel/swarm/DilocoStrategy.h"
#include "cohort/parallel/swarm/SwarmStrategy.h"
#include "cohort/util/Error.h"

namespace cohort {

at::Tensor squared_sum(const std::vector<at::Tensor>& tensors) {
  at::Tensor sq;
  for (const auto& t : tensors) {
    if (!t.defined()) continue;
    auto s = t.to(at::kDouble).pow(2).sum();
    sq = sq.defined() ? sq + s : s;  // added in order, as a host loop would
  }
  return sq.defined() ? sq : at::zeros({}, at::kDouble);
}

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

class DdpStrategy : public Strategy {
 public:
  DdpStrategy(std::shared_ptr<torch::nn::Module> model, CommunicatorPtr comm, DdpOptions opts,
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
  }
  void freeze(const std::string& name) override { optimizer_->freeze(name); }
  std::shared_ptr<void> gradient_sync(bool enabled) override {
    if (enabled) return nullptr;
    return std::make_shared<DistributedDataParallel::NoSync>(ddp_.no_sync());
  }
  StepResult step(double lr, const StepOptions& o) override {
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
      comm_->all_reduce(flag, ReduceOp::kMax, "inf/NaN gradient flag")->wait();
      r.nonfinite = flag.item<double>() > 0;
    }
    if (o.clip_norm > 0 && !r.nonfinite) r.grad_norm = clip_full_gradients(params, o.clip_norm);
    r.skipped = r.nonfinite && o.skip_nonfinite;
    if (!r.skipped) {
      optimizer_->step(lr);
      masters_.master_to_model();
    }
    optimizer_->zero_grad();
    masters_.zero_model_grads();
    return r;
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
  std::shared_ptr<torch::nn::Module> model_;
  CommunicatorPtr comm_;
  DistributedDataParallel ddp_;
  amp::MasterWeights masters_;
  std::unique_ptr<optim::Optimizer> optimizer_;
};

}  // namespace

optim::GroupRule group_rule(const OptimConfig& cfg) {
  return {cfg.weight_decay, cfg.decay_norm_and_bias, cfg.norm_lr_scale};
}

std::shared_ptr<CommHook> make_comm_hook(const TrainConfig& cfg) {
  const auto& c = cfg.dist.compress;
  if (c == "fp16") return std::make_shared<LowPrecisionHook>(at::kHalf);
  if (c == "bf16") return std::make_shared<LowPrecisionHook>(at::kBFloat16);
  if (c == "powersgd") {
    PowerSgdOptions o;
    o.rank = cfg.powersgd.rank;
    o.start_iter = cfg.powersgd.start_iter;
    o.min_compression_rate = cfg.powersgd.min_compression_rate;
    o.error_feedback = cfg.powersgd.error_feedback;
    o.warm_start = cfg.powersgd.warm_start;
    o.seed = cfg.train.seed;
    return std::make_shared<PowerSgdHook>(o);
  }
  return std::make_shared<AllReduceHook>();
}

std::unique_ptr<Strategy> make_strategy(const TrainConfig& cfg, std::shared_ptr<torch::nn::Module> model,
                                        CommunicatorPtr comm) {
  if (cfg.dist.strategy == "swarm" || cfg.dist.strategy == "diloco") {
#if COHORT_HAVE_SWARM
    if (cfg.dist.strategy == "diloco") return make_diloco_strategy(cfg, std::move(model), std::move(comm));
    return make_swarm_strategy(cfg, std::move(model), std::move(comm));
#else
    throw ConfigError("dist.strategy=" + cfg.dist.strategy +
                          " is not built into this cohort: OpenDHT (libopendht-dev) was not found "
                          "when it was compiled (Debian 13 has no OpenDHT package)",
                      "build cohort where libopendht-dev is installed (Debian 12), or use dist.strategy=ddp");
#endif
  }
  if (cfg.dist.strategy != "ddp") {
    ShardedOptions o;
    o.stage = cfg.dist.strategy == "zero1"   ? ShardStage::kZero1
              : cfg.dist.strategy == "zero2" ? ShardStage::kZero2
                                             : ShardStage::kFsdp;
    o.bucket_mb = cfg.dist.bucket_mb;
    o.fsdp_unit = cfg.dist.fsdp_unit;
    o.broadcast_buffers = cfg.dist.broadcast_buffers;
    return make_sharded_strategy(std::move(model), std::move(comm), o);
  }
  DdpOptions opts;
  opts.bucket_mb = cfg.dist.bucket_mb;
  opts.first_bucket_mb = cfg.dist.first_bucket_mb;
  opts.overlap = cfg.dist.overlap;
  opts.find_unused_parameters = cfg.dist.find_unused_parameters;
  opts.broadcast_buffers = cfg.dist.broadcast_buffers;
  return std::make_unique<DdpStrategy>(std::move(model), std::move(comm), opts, make_comm_hook(cfg));
}

}  // namespace cohort

#include "cohort/parallel/swarm/SwarmStrategy.h"

#include <chrono>
#include <iostream>

#include "cohort/p2p/Codec.h"
#include "cohort/parallel/Params.h"
#include "cohort/parallel/swarm/PeerState.h"
#include "cohort/parallel/swarm/SwarmPeer.h"
#include "cohort/util/Error.h"

namespace cohort::parallel::swarm {
namespace {

using Clock = std::chrono::steady_clock;
constexpr const char* kResidual = "swarm.residual";

class SwarmStrategy : public Strategy {
 public:
  SwarmStrategy(const TrainConfig& cfg, std::shared_ptr<torch::nn::Module> model, comm::CommunicatorPtr comm,
                std::unique_ptr<Strategy> inner)
      : comm_(comm),
        model_(model),
        trainable_(trainable_parameters(*model, "swarm")),
        target_(cfg.swarm.target_batch_size > 0
                    ? cfg.swarm.target_batch_size
                    : cfg.data.batch_size * cfg.train.grad_accum_steps * cfg.swarm.partitions * comm->size()),
        partition_(cfg.swarm.sampler == "partition"),
        samples_per_batch_(cfg.data.batch_size * comm->size()),
        codec_(p2p::codec_from_name(cfg.swarm.compress, "swarm.compress")),
        averages_state_(cfg.swarm.group_size > 0),
        average_state_every_(state_average_every(cfg.swarm, false)) {
    inner_ = std::move(inner);  // the peer's own workers: a ddp job
    if (comm->rank() == 0) peer_ = std::make_unique<parallel::swarm::SwarmPeer>(cfg, codec_, "average", comm->flight());
  }

  std::string name() const override { return "swarm"; }
  void build_optimizer(const OptimConfig& cfg) override { inner_->build_optimizer(cfg); }
  std::shared_ptr<void> gradient_sync(bool enabled) override { return inner_->gradient_sync(enabled); }
  void freeze(const std::string& param_name) override { inner_->freeze(param_name); }
  SyncBytes last_sync_bytes() const override { return last_sync_; }
  StateBytes state_bytes() const override {
    auto b = inner_->state_bytes();
    if (accumulated_.defined()) b.grads += accumulated_.numel() * 4;
    return b;
  }
  StrategyState save_state() override {
    auto out = inner_->save_state();
    if (residual_.defined() && comm_->rank() == 0) out.resume.emplace_back(kResidual, residual_.clone());
    return out;
  }
  void load_state(const optim::NamedState& optimizer, const checkpoint::NamedTensors& resume) override {
    checkpoint::NamedTensors rest;
    for (const auto& [name, t] : resume) {
      if (name == kResidual) {
        // Only int8 feeds it back: a run resumed with another codec drops it instead of carrying it on.
        if (codec_ == p2p::Codec::kInt8) residual_ = t.to(at::kFloat).clone();
      } else {
        rest.emplace_back(name, t);
      }
    }
    inner_->load_state(optimizer, rest);
    // rank 0 saved it; the peer's other workers take rank 0's (zero: nothing lost yet).
    if (codec_ != p2p::Codec::kInt8 || comm_->size() == 1) return;
    if (!residual_.defined()) residual_ = at::zeros({trainable_numel()}, at::kFloat);
    comm_->broadcast(residual_, 0, "swarm: the int8 residual")->wait();
  }
  std::vector<std::pair<std::string, double>> figures() const override {
    if (!peer_) return {};
    auto out = peer_->figures();
    // The samples this peer trained on, all its workers together: the swarm's global steps count
    // swarm.target_batch_size each, and this says what the peers really took (Note [A swarm step is the
    // target batch, not twice it] in SwarmProgress.cpp).
    out.emplace_back("swarm_samples", static_cast<double>(trained_samples_));
    return out;
  }

  // Note [A swarm step accumulates until the swarm is ready]
  // Each call adds this peer's batch to its accumulated gradient (a sum of per-batch means, so the
  // contribution is their mean) and returns applied=false until the peers together reach
  // swarm.target_batch_size; then the ready peers average their contributions weighted by samples and
  // each applies the same update through the peer's inner ddp strategy (clipping, the optimizer).
  StepResult step(double lr, const StepOptions& options) override {
    // Between updates the weights are those of step options.step: a newcomer may have them.
    if (peer_) peer_->serve_state(options.step, [this] { return serialize_state(); });
    accumulate();
    if (!ready(options.step)) {
      StepResult r;
      r.applied = false;
      return r;
    }
    auto contribution = batches_ == 1 ? accumulated_ : accumulated_ / static_cast<double>(batches_);
    // Note [A swarm's int8 gradients carry what the wire lost]
    // Int8 loses up to half a step of each
    // block's scale (a 254th of its largest value); that loss goes into the next step's contribution
    // (error feedback), as DiLoCo's int8 does, so no gradient is lost for good. fp16 keeps 11 bits and
    // carries nothing, as Hivemind's Float16Compression.
    if (codec_ == p2p::Codec::kInt8) contribution = p2p::with_error_feedback(contribution, residual_, codec_);
    if (peer_) contribution = peer_->average(options.step, contribution, samples_, wire_bytes_);
    if (comm_->size() > 1) comm_->broadcast(contribution, 0, "swarm: the averaged gradient")->wait();
    write_gradients(contribution);
    accumulated_ = at::Tensor();
    batches_ = samples_ = 0;
    auto result = inner_->step(lr, options);
    average_state(options.step);
    last_sync_ = {wire_bytes_, contribution.numel() * 4};
    if (peer_) peer_->settled(options.step + 1, [this] { return parallel::swarm::weights_digest(*model_); });
    return result;
  }

  // Note [A newcomer catches up]
  // The peer's first worker downloads a live peer's model (parameters and
  // buffers) and optimizer state, verified against the donor's digest (p2p/StateTransfer.h), and hands
  // it to the peer's other workers; every worker loads it and the loop goes on from the donor's step.
  std::optional<int64_t> catch_up(int64_t step) override {
    std::string bytes;
    int64_t to_step = -1;
    if (peer_)
      if (auto got = peer_->catch_up(step)) bytes = std::move(got->bytes), to_step = got->step;
    parallel::swarm::share_with_local_workers(*comm_, bytes, to_step);
    if (to_step < 0) return std::nullopt;
    const auto state = parallel::swarm::unpack_peer_state(bytes);
    parallel::swarm::load_model_state(*model_, state);
    inner_->load_state(state.optimizer, {});
    if (peer_) peer_->settled(to_step, [this] { return parallel::swarm::weights_digest(*model_); });
    return to_step;
  }

 private:
  int64_t trainable_numel() const {
    int64_t n = 0;
    for (const auto& p : trainable_.params) n += p.numel();
    return n;
  }

  // The state a newcomer needs: every parameter and buffer and the optimizer's state.
  std::string serialize_state() {
    return parallel::swarm::pack_peer_state(*model_, inner_->save_state().optimizer, {});
  }

  void accumulate() {
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> flat;
    for (const auto& p : trainable_.params)
      flat.push_back(p.grad().defined() ? p.grad().reshape(-1).to(at::kFloat) : at::zeros({p.numel()}, at::kFloat));
    auto batch = at::cat(flat);
    accumulated_ = accumulated_.defined() ? accumulated_.add_(batch) : batch;
    ++batches_;
    samples_ += samples_per_batch_;
    trained_samples_ += samples_per_batch_;
    for (const auto& p : trainable_.params)
      if (p.grad().defined()) p.grad().zero_();
  }

  // swarm.average_state_every with swarm.group_size: the step's group averages its trainable weights
  // (Note [Groups on a grid] in p2p/Matchmaking.cpp); the peer's other workers take its first worker's.
  void average_state(int64_t step) {
    if (!averages_state_ || (step + 1) % average_state_every_ != 0) return;
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> flat;
    for (const auto& p : trainable_.params) flat.push_back(p.detach().reshape(-1).to(at::kFloat));
    auto weights = at::cat(flat);
    if (peer_) weights = peer_->average_state(step, weights, wire_bytes_, average_state_every_ == 1);
    if (comm_->size() > 1) comm_->broadcast(weights, 0, "swarm: the averaged weights")->wait();
    int64_t offset = 0;
    for (auto& p : trainable_.params) {
      const auto n = p.numel();
      p.detach().copy_(weights.slice(0, offset, offset + n).view(p.sizes()));
      offset += n;
    }
  }

  // Whether the swarm averages now: the peer's first worker decides, its other workers follow.
  bool ready(int64_t step) {
    bool go = partition_;  // fixed per-peer batches: one batch per peer per step
    if (peer_ && !go) go = peer_->ready(step, samples_, target_, samples_per_batch_);
    if (comm_->size() > 1) {
      auto flag = at::full({1}, go ? 1.0 : 0.0, at::kDouble);
      comm_->broadcast(flag, 0, "swarm: ready")->wait();
      go = flag.item<double>() > 0;
    }
    return go;
  }

  void write_gradients(const at::Tensor& flat) {
    at::NoGradGuard no_grad;
    int64_t offset = 0;
    for (auto& p : trainable_.params) {
      const auto n = p.numel();
      auto values = flat.slice(0, offset, offset + n).view(p.sizes()).to(p.scalar_type());
      if (p.grad().defined())
        p.mutable_grad().copy_(values);
      else
        p.mutable_grad() = values.clone();
      offset += n;
    }
  }

  comm::CommunicatorPtr comm_;
  std::shared_ptr<torch::nn::Module> model_;
  Trainable trainable_;
  int64_t target_;
  bool partition_;
  int64_t samples_per_batch_;
  p2p::Codec codec_;
  bool averages_state_;
  int64_t average_state_every_;
  at::Tensor residual_;  // swarm.compress=int8: what the wire lost of the last contribution
  std::unique_ptr<Strategy> inner_;
  std::unique_ptr<parallel::swarm::SwarmPeer> peer_;
  at::Tensor accumulated_;
  int64_t batches_ = 0, samples_ = 0, wire_bytes_ = 0;
  int64_t trained_samples_ = 0;  // since this process started
  SyncBytes last_sync_;
};

}  // namespace

std::unique_ptr<Strategy> make_swarm_strategy(const TrainConfig& cfg, std::shared_ptr<torch::nn::Module> model,
                                              comm::CommunicatorPtr comm, std::unique_ptr<Strategy> inner) {
  return std::make_unique<SwarmStrategy>(cfg, std::move(model), std::move(comm), std::move(inner));
}

}  // namespace cohort::parallel::swarm

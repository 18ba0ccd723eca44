#include "cohort/parallel/swarm/DilocoStrategy.h"

#include "cohort/parallel/Params.h"
#include "cohort/parallel/swarm/PeerState.h"
#include "cohort/parallel/swarm/SwarmPeer.h"
#include "cohort/swarm/Codec.h"

namespace cohort {
namespace {

// The names of the outer optimizer's state among a checkpoint's resume tensors.
constexpr const char* kOuterWeights = "diloco.outer_weights";
constexpr const char* kOuterMomentum = "diloco.outer_momentum";
constexpr const char* kResidual = "diloco.residual";

class DilocoStrategy : public Strategy {
 public:
  DilocoStrategy(const TrainConfig& cfg, std::shared_ptr<torch::nn::Module> model, CommunicatorPtr comm)
      : comm_(comm),
        model_(model),
        trainable_(trainable_parameters(*model, "diloco")),
        inner_steps_(cfg.diloco.inner_steps),
        outer_lr_(cfg.diloco.outer_lr),
        outer_momentum_(cfg.diloco.outer_momentum),
        codec_(swarm::codec_from_name(cfg.diloco.compress, "diloco.compress")),
        samples_per_step_(cfg.data.batch_size * cfg.train.grad_accum_steps * comm->size()) {
    TrainConfig local = cfg;  // inside the peer its workers are a ddp job; DiLoCo is between peers
    local.dist.strategy = "ddp";
    inner_ = make_strategy(local, std::move(model), comm);
    if (comm->rank() == 0) peer_ = std::make_unique<swarm::SwarmPeer>(cfg);
  }

  std::string name() const override { return "diloco"; }
  void build_optimizer(const OptimConfig& cfg) override {
    inner_->build_optimizer(cfg);
    outer_ = flat_weights();
    momentum_ = at::zeros_like(outer_);
    residual_ = at::zeros_like(outer_);
  }
  std::shared_ptr<void> gradient_sync(bool enabled) override { return inner_->gradient_sync(enabled); }
  void freeze(const std::string& param_name) override { inner_->freeze(param_name); }
  SyncBytes last_sync_bytes() const override { return last_sync_; }
  StateBytes state_bytes() const override {
    auto b = inner_->state_bytes();
    b.optimizer += (outer_.numel() + momentum_.numel() + residual_.numel()) * 4;
    return b;
  }
  std::vector<std::pair<std::string, double>> figures() const override {
    return peer_ ? peer_->figures() : std::vector<std::pair<std::string, double>>{};
  }

  StepResult step(double lr, const StepOptions& options) override {
    // At an outer step's boundary the weights are the outer weights: what a newcomer needs.
    if (peer_ && options.step % inner_steps_ == 0)
      peer_->serve_state(options.step / inner_steps_, [this] { return serialize_state(); });
    auto r = inner_->step(lr, options);
    if ((options.step + 1) % inner_steps_ == 0) outer_step((options.step + 1) / inner_steps_ - 1);
    return r;
  }

  // A newcomer, or a peer two outer rounds behind, takes a live peer's weights, inner optimizer state and
  // outer momentum at an outer step's boundary (Note [A newcomer catches up] in SwarmStrategy.cpp); the
  // swarm's records count outer rounds. Its int8 residual starts from zero: it is this peer's own.
  std::optional<int64_t> catch_up(int64_t step) override {
    if (step % inner_steps_ != 0) return std::nullopt;
    std::string bytes;
    int64_t round = -1;
    if (peer_)
      if (auto got = peer_->catch_up(step / inner_steps_)) bytes = std::move(got->bytes), round = got->step;
    swarm::share_with_local_workers(*comm_, bytes, round);
    if (round < 0) return std::nullopt;
    const auto state = swarm::unpack_peer_state(bytes);
    swarm::load_model_state(*model_, state);
    inner_->load_state(state.optimizer, {});
    build_outer_from_weights();
    for (const auto& [name, t] : state.extra)
      if (name == kOuterMomentum) momentum_ = t.to(at::kFloat).clone();
    if (peer_) peer_->settled(round, swarm::weights_digest(*model_));
    return round * inner_steps_;
  }

  StrategyState save_state() override {
    auto out = inner_->save_state();
    if (comm_->rank() == 0) {
      out.resume.emplace_back(kOuterWeights, outer_.clone());
      out.resume.emplace_back(kOuterMomentum, momentum_.clone());
      out.resume.emplace_back(kResidual, residual_.clone());
    }
    return out;
  }
  void load_state(const optim::NamedState& optimizer, const checkpoint::NamedTensors& resume) override {
    checkpoint::NamedTensors rest;
    bool found = false;
    for (const auto& [name, t] : resume) {
      if (name == kOuterWeights)
        outer_ = t.to(at::kFloat).clone(), found = true;
      else if (name == kOuterMomentum)
        momentum_ = t.to(at::kFloat).clone();
      else if (name == kResidual)
        residual_ = t.to(at::kFloat).clone();
      else
        rest.emplace_back(name, t);
    }
    inner_->load_state(optimizer, rest);
    // A checkpoint of another strategy has no outer state: the outer loop starts from the loaded weights.
    if (!found) build_outer_from_weights();
    // rank 0 saved it; the peer's other workers take rank 0's.
    if (comm_->size() > 1)
      for (auto* t : {&outer_, &momentum_, &residual_}) comm_->broadcast(*t, 0, "diloco: outer state")->wait();
  }

 private:
  void build_outer_from_weights() {
    outer_ = flat_weights();
    momentum_ = at::zeros_like(outer_);
    residual_ = at::zeros_like(outer_);
  }

  std::string serialize_state() {
    return swarm::pack_peer_state(*model_, inner_->save_state().optimizer, {{kOuterMomentum, momentum_}});
  }

  at::Tensor flat_weights() const {
    std::vector<at::Tensor> flat;
    for (const auto& p : trainable_.params) flat.push_back(p.detach().reshape(-1).to(at::kFloat));
    return at::cat(flat);
  }

  // Note [DiLoCo's outer step]: the pseudo-gradient (outer - current, plus what int8 lost last time) is
  // averaged across the group; the outer optimizer is torch.optim.SGD with Nesterov momentum on it:
  // buf = mu * buf + g; outer -= lr * (g + mu * buf). Every peer of the group applies the same update
  // to the same outer weights, so they leave the outer step identical.
  void outer_step(int64_t round) {
    at::NoGradGuard no_grad;
    auto pseudo = outer_ - flat_weights();
    if (codec_ != swarm::Codec::kNone) pseudo.add_(residual_);
    int64_t wire = 0;
    auto averaged = pseudo;
    if (peer_) averaged = peer_->average(round, pseudo, samples_per_step_ * inner_steps_, wire);
    if (comm_->size() > 1) comm_->broadcast(averaged, 0, "diloco: the averaged pseudo-gradient")->wait();
    if (codec_ != swarm::Codec::kNone) residual_ = pseudo - swarm::roundtrip(pseudo, codec_);
    momentum_.mul_(outer_momentum_).add_(averaged);
    outer_.sub_(averaged.add(momentum_, outer_momentum_), outer_lr_);
    int64_t offset = 0;
    for (auto& p : trainable_.params) {
      const auto n = p.numel();
      p.detach().copy_(outer_.slice(0, offset, offset + n).view(p.sizes()));
      offset += n;
    }
    // After an outer step the group's peers hold the same weights (Note [Peers that drifted apart
    // resynchronize] in SwarmPeer.cpp); between outer steps each peer's are its own.
    if (peer_) peer_->settled(round + 1, swarm::weights_digest(*model_));
    // Per step, amortized over the inner steps, against the all-reduce of every step's gradients that ddp
    // would send (so summary.json's compression_ratio is DiLoCo's saving).
    last_sync_ = {wire / inner_steps_, outer_.numel() * 4};
  }

  CommunicatorPtr comm_;
  std::shared_ptr<torch::nn::Module> model_;
  Trainable trainable_;
  int64_t inner_steps_;
  double outer_lr_, outer_momentum_;
  swarm::Codec codec_;
  int64_t samples_per_step_;
  std::unique_ptr<Strategy> inner_;
  std::unique_ptr<swarm::SwarmPeer> peer_;
  at::Tensor outer_, momentum_, residual_;
  SyncBytes last_sync_;
};

}  // namespace

std::unique_ptr<Strategy> make_diloco_strategy(const TrainConfig& cfg, std::shared_ptr<torch::nn::Module> model,
                                               CommunicatorPtr comm) {
  return std::make_unique<DilocoStrategy>(cfg, std::move(model), std::move(comm));
}

}  // namespace cohort

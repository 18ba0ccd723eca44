#include "cohort/parallel/swarm/DilocoStrategy.h"

#include <algorithm>
#include <iostream>

#include "cohort/p2p/Codec.h"
#include "cohort/parallel/Params.h"
#include "cohort/parallel/swarm/PeerState.h"
#include "cohort/parallel/swarm/SwarmPeer.h"

namespace cohort::parallel::swarm {
namespace {

// The names of the outer optimizer's state among a checkpoint's resume tensors.
constexpr const char* kOuterWeights = "diloco.outer_weights";
constexpr const char* kOuterMomentum = "diloco.outer_momentum";
constexpr const char* kResidual = "diloco.residual";

class DilocoStrategy : public Strategy {
 public:
  DilocoStrategy(const TrainConfig& cfg, std::shared_ptr<torch::nn::Module> model, comm::CommunicatorPtr comm,
                 std::unique_ptr<Strategy> inner)
      : comm_(comm),
        model_(model),
        trainable_(trainable_parameters(*model, "diloco")),
        inner_steps_(cfg.diloco.inner_steps),
        outer_lr_(cfg.diloco.outer_lr),
        outer_momentum_(cfg.diloco.outer_momentum),
        codec_(p2p::codec_from_name(cfg.diloco.compress, "diloco.compress")),
        samples_per_step_(cfg.data.batch_size * cfg.train.grad_accum_steps * comm->size()),
        averages_state_(cfg.swarm.group_size > 0),
        average_state_every_(state_average_every(cfg.swarm, true)) {
    inner_ = std::move(inner);  // the peer's own workers: a ddp job
    if (comm->rank() == 0) peer_ = std::make_unique<parallel::swarm::SwarmPeer>(cfg, codec_, "outer", comm->flight());
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
    // Note [A DiLoCo peer serves its last boundary]
    // At an outer step's boundary the weights are the
    // outer weights, what a newcomer needs; the state is taken then and served at every inner step until
    // the next boundary. Served at boundaries only, a request waited up to an outer round (18 s at
    // H = 50 in bench/swarm.py) for its answer, past the download's patience: a DiLoCo newcomer found
    // no donor and trained alone. The state it gets is of a round the others are partway through: Note
    // [A DiLoCo newcomer starts where the others are]. The boundary is taken where it is reached: the
    // run's first step, each outer step's end (before the trainer's catch_up, so that a peer that just
    // announced the next round never answers with the last), and a download's landing (catch_up).
    if (peer_ && snapshot_round_ < 0 && options.step % inner_steps_ == 0)
      take_snapshot(options.step / inner_steps_, serialize_state());
    if (peer_ && snapshot_round_ >= 0) peer_->serve_state(snapshot_round_, [this] { return snapshot_; });
    auto r = inner_->step(lr, options);
    const int64_t round = options.step / inner_steps_;
    // Where this peer is within the round: a newcomer starts where the others are (catch_up).
    if (peer_) peer_->progress(round, (options.step + 1 - round * inner_steps_) * samples_per_step_);
    // The samples this round's pseudo-gradient holds: a whole round's, or a newcomer's rest of one.
    // Note [A DiLoCo run ends on an outer step]
    // The run's last step closes its round early, so every peer
    // ends on the same weights (the run's model, as ddp's ranks end on one), not on a few inner steps of
    // its own. That last outer step is the plain average of the peers' weights, without the outer lr and
    // momentum: a Nesterov step there moved the weights away from the batch-norm statistics with no inner
    // step left to follow them (bench/swarm.py at H = 50: best 90.07% during the run, 87.52% at its end).
    if ((options.step + 1) % inner_steps_ == 0 || options.last)
      outer_step(round, (options.step + 1 - std::max(round_start_, round * inner_steps_)) * samples_per_step_,
                 options.last);
    return r;
  }

  // A newcomer, or a peer two outer rounds behind, takes a live peer's weights, inner optimizer state and
  // outer momentum at an outer step's boundary (Note [A newcomer catches up] in SwarmStrategy.cpp); the
  // swarm's records count outer rounds. Its int8 residual starts from zero: it is this peer's own.
  // Note [A DiLoCo newcomer starts where the others are]
  // The others are partway through that round
  // (Note [A DiLoCo peer serves its last boundary]); started at the boundary, the newcomer would reach the
  // outer step after they closed it, step alone, download again and land as far behind, round after
  // round (seen: a newcomer that never averaged with the others in bench/swarm.py at H = 50). It starts
  // at the step the furthest of them announced, takes the rest of the round's inner steps from the outer
  // weights, and its pseudo-gradient counts for the samples it trained (the average is weighted by them).
  std::optional<int64_t> catch_up(int64_t step) override {
    if (step % inner_steps_ != 0) return std::nullopt;
    std::string bytes;
    int64_t round = -1, into = 0;
    if (peer_)
      if (auto got = peer_->catch_up(step / inner_steps_)) {
        bytes = std::move(got->bytes), round = got->step;
        into = std::min(inner_steps_ - 1, peer_->others_progress(round) / samples_per_step_);
      }
    parallel::swarm::share_with_local_workers(*comm_, bytes, round);
    if (round < 0) return std::nullopt;
    if (comm_->size() > 1) {
      auto t = at::tensor({into}, at::kLong);
      comm_->broadcast(t, 0, "diloco: the newcomer's step within the round")->wait();
      into = t.item<int64_t>();
    }
    const auto state = parallel::swarm::unpack_peer_state(bytes);
    parallel::swarm::load_model_state(*model_, state);
    inner_->load_state(state.optimizer, {});
    build_outer_from_weights();
    for (const auto& [name, t] : state.extra)
      if (name == kOuterMomentum) momentum_ = t.to(at::kFloat).clone();
    if (peer_) peer_->settled(round, [this] { return parallel::swarm::weights_digest(*model_); });
    // What it downloaded is that round's boundary, the state it serves until its next one (Note [A DiLoCo
    // peer serves its last boundary]). Kept from its own last boundary instead, a peer that caught up
    // round after round served a state rounds old under a record of the swarm's step: a peer that took it
    // went back (seen: "caught up to step 2" at step 4, with peer 0 evaluating alone in bench/swarm.py).
    if (peer_) take_snapshot(round, std::move(bytes));
    if (peer_ && into > 0)
      std::cerr << "cohort: diloco: the others are " << into << " of " << inner_steps_ << " inner steps into round "
                << round << ": this peer starts there\n";
    round_start_ = round * inner_steps_ + into;
    return round_start_;
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

  void take_snapshot(int64_t round, std::string state) {
    snapshot_ = std::move(state);
    snapshot_round_ = round;
    peer_->serve_state(snapshot_round_, [this] { return snapshot_; });
  }

  std::string serialize_state() {
    return parallel::swarm::pack_peer_state(*model_, inner_->save_state().optimizer, {{kOuterMomentum, momentum_}});
  }

  at::Tensor flat_weights() const {
    std::vector<at::Tensor> flat;
    for (const auto& p : trainable_.params) flat.push_back(p.detach().reshape(-1).to(at::kFloat));
    return at::cat(flat);
  }

  // Note [DiLoCo's outer step]
  // The pseudo-gradient (outer - current, plus what int8 lost last time) is
  // averaged across the group; the outer optimizer is torch.optim.SGD with Nesterov momentum on it:
  // buf = mu * buf + g; outer -= lr * (g + mu * buf). Every peer of the group applies the same update
  // to the same outer weights, so they leave the outer step identical.
  void outer_step(int64_t round, int64_t samples, bool last) {
    at::NoGradGuard no_grad;
    const auto pseudo = p2p::with_error_feedback(outer_ - flat_weights(), residual_, codec_);
    int64_t wire = 0;
    auto averaged = pseudo;
    if (peer_) averaged = peer_->average(round, pseudo, samples, wire);
    if (comm_->size() > 1) comm_->broadcast(averaged, 0, "diloco: the averaged pseudo-gradient")->wait();
    if (last) {
      outer_.sub_(averaged);  // the peers' weights averaged (Note [A DiLoCo run ends on an outer step])
    } else {
      momentum_.mul_(outer_momentum_).add_(averaged);
      outer_.sub_(averaged.add(momentum_, outer_momentum_), outer_lr_);
    }
    average_outer_state(round, last, wire);
    int64_t offset = 0;
    for (auto& p : trainable_.params) {
      const auto n = p.numel();
      p.detach().copy_(outer_.slice(0, offset, offset + n).view(p.sizes()));
      offset += n;
    }
    // After an outer step the group's peers hold the same weights (Note [Peers that drifted apart
    // resynchronize] in SwarmPeer.cpp); between outer steps each peer's are its own.
    if (peer_) peer_->settled(round + 1, [this] { return parallel::swarm::weights_digest(*model_); });
    if (peer_) take_snapshot(round + 1, serialize_state());
    // Per step, amortized over the inner steps, against the all-reduce of every step's gradients that ddp
    // would send (so summary.json's compression_ratio is DiLoCo's saving).
    last_sync_ = {wire / inner_steps_, outer_.numel() * 4};
  }

  // Note [DiLoCo in bounded groups]
  // With swarm.group_size, an outer round averages the pseudo-gradients
  // of its group only (Note [Groups on a grid] in p2p/Matchmaking.cpp). The members of a group come from
  // different groups of the round before, with different outer weights, and each applies the group's
  // averaged change to its own: their outer states stay apart. So every swarm.average_state_every outer
  // rounds, and at the run's last, the round's group also averages its outer weights and momentum (fp32,
  // twice the model: 8 times what int8 pseudo-gradients take), in groups that change from round to round,
  // so the outer states mix across the swarm as the swarm's weights do. After such a round the members of
  // one group hold the same outer state; a run ends with each last group's own weights, close to the
  // others' but not equal.
  void average_outer_state(int64_t round, bool last, int64_t& wire) {
    if (!averages_state_ || (!last && (round + 1) % average_state_every_ != 0)) return;
    auto both = at::cat({outer_, momentum_});
    // Outer rounds are far apart, and the run's last has no next one: never put off (may_skip false).
    if (peer_) both = peer_->average_state(round, both, wire, false);
    if (comm_->size() > 1) comm_->broadcast(both, 0, "diloco: the group's averaged outer state")->wait();
    const auto n = outer_.numel();
    outer_.copy_(both.slice(0, 0, n));
    momentum_.copy_(both.slice(0, n, 2 * n));
  }

  comm::CommunicatorPtr comm_;
  std::shared_ptr<torch::nn::Module> model_;
  Trainable trainable_;
  int64_t inner_steps_;
  double outer_lr_, outer_momentum_;
  p2p::Codec codec_;
  int64_t samples_per_step_;
  bool averages_state_;          // swarm.group_size > 0: Note [DiLoCo in bounded groups]
  int64_t average_state_every_;  // outer rounds
  std::unique_ptr<Strategy> inner_;
  std::unique_ptr<parallel::swarm::SwarmPeer> peer_;
  std::string snapshot_;  // the state at the last outer boundary (rank 0), what serve_state answers with
  int64_t snapshot_round_ = -1;
  int64_t round_start_ = 0;  // where a newcomer started, partway into a round (catch_up)
  at::Tensor outer_, momentum_, residual_;
  SyncBytes last_sync_;
};

}  // namespace

std::unique_ptr<Strategy> make_diloco_strategy(const TrainConfig& cfg, std::shared_ptr<torch::nn::Module> model,
                                               comm::CommunicatorPtr comm, std::unique_ptr<Strategy> inner) {
  return std::make_unique<DilocoStrategy>(cfg, std::move(model), std::move(comm), std::move(inner));
}

}  // namespace cohort::parallel::swarm

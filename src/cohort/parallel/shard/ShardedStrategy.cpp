#include "cohort/parallel/shard/ShardedStrategy.h"

#include <chrono>
#include <cmath>
#include <utility>

#include "cohort/amp/GradScaler.h"
#include "cohort/models/Models.h"
#include "cohort/parallel/Params.h"
#include "cohort/parallel/shard/FlatUnits.h"
#include "cohort/parallel/shard/OptimizerSlices.h"
#include "cohort/parallel/shard/UnitRunner.h"
#include "cohort/parallel/shard/Units.h"
#include "cohort/util/Error.h"

namespace cohort::parallel::shard {
namespace {

// zero1, zero2 and fsdp are the same flat units, optimizer slices and unit runner under three policies.
struct StagePolicy {
  const char* name;
  bool units_stay_gathered;  // else gathered around each use and freed after it (FSDP)
  bool full_gradients;       // gradients stay whole through backward and are reduced at the step (ZeRO-1;
                             // during backward under optim.in_backward)
  bool runs_model_units;     // the model calls the runner around each block (FSDP)
};
constexpr StagePolicy kZero1{"zero1", true, true, false};
constexpr StagePolicy kZero2{"zero2", true, false, false};
constexpr StagePolicy kFsdp{"fsdp", false, false, true};

const StagePolicy& policy_of(ShardStage stage) {
  switch (stage) {
    case ShardStage::kZero1: return kZero1;
    case ShardStage::kZero2: return kZero2;
    case ShardStage::kFsdp: break;
  }
  return kFsdp;
}

models::Classifier* unit_model(torch::nn::Module& model, const StagePolicy& policy) {
  if (!policy.runs_model_units) return nullptr;
  auto* classifier = dynamic_cast<models::Classifier*>(&model);
  if (!classifier)
    throw ConfigError("dist.strategy=fsdp needs a cohort model (a models::Classifier) to find its units",
                      "use zero2 for other modules");
  return classifier;
}

// Note [Sharded steps inside backward]
// With optim.in_backward=true, zero1, zero2 and fsdp step each unit's slice as soon as that unit's
// reduce-scatter has ended, while backward goes on (the ddp form: Note [The optimizer inside backward] in
// parallel/ddp/DdpStrategy.cpp). The unit runner hands the units over in the order they were reduced
// (UnitRunner::set_on_unit_reduced); step() then checks, across ranks, that no slice was non-finite and
// gathers the updated parameters, as the plain step ends.
// - Same numbers: a slice gets the update the plain step gives it, from the same reduce-scatter.
// - Safe during backward: the optimizer updates the float32 master slices, never the gathered
//   parameters backward still reads; those change only at the gather in step().
// - zero1 keeps whole gradients (its memory is ddp's), but under in_backward its units are reduced
//   during backward, as zero2's are, so there is something for the step to hide behind. PyTorch's
//   ZeroRedundancyOptimizer(overlap_with_ddp=True) likewise steps each shard after DDP's bucket all-reduce.
// - Each rank holds only its slice, so an inf or NaN is seen by one rank: it stops stepping its own
//   slices there, and step()'s all-reduce of the flag tells every rank. Slices stepped before it have
//   moved (StepResult::updated_in_backward); the loop stops as it does for any non-finite gradient in
//   fp32 or bf16. The collectives stay the same on every rank whatever each stepped.
// - What stays exposed: the gather of every unit at the step, as in the plain step, and the last unit's
//   slice step. Stepping is 1/world of ddp's optimizer work, so there is less to hide.
// - Gloo keeps its two threads here (ddp's in_backward takes one, train/Setup.cpp): with one, the gathers
//   at the step queue one behind another, and zero2's ResNet-50 step over a 1 Gbit/s link took 27% longer
//   than the plain step; with two it is as fast (bench/in_backward.py --strategy zero2).
class ShardedImpl : public ShardedStrategy {
 public:
  ShardedImpl(std::shared_ptr<torch::nn::Module> model, comm::CommunicatorPtr comm, ShardedOptions options)
      : model_(std::move(model)),
        comm_(std::move(comm)),
        options_(options),
        policy_(policy_of(options.stage)),
        classifier_(unit_model(*model_, policy_)),
        trainable_(trainable_parameters(*model_, policy_.name)) {
    for (const auto& b : model_->buffers(true)) buffers_.push_back(b);
    check_replicas_match(trainable_, *comm_, name());
    broadcast_from_rank0(trainable_.params, *comm_, name() + " initial parameters");
    broadcast_from_rank0(buffers_, *comm_, name() + " initial buffers");
    // The same walk over the model as plan_shards, so the plan a bench or test predicts is this one.
    auto layout = parallel::shard::plan_units(*model_, trainable_.specs(), options_);
    plan_ = parallel::shard::ShardPlan(trainable_.specs(), std::move(layout.units), comm_->size());
    units_ = std::make_unique<parallel::shard::FlatUnits>(
        plan_, trainable_, *comm_, parallel::shard::UnitOptions{policy_.units_stay_gathered, policy_.full_gradients},
        name(), &trace_);
    // zero1 reduces in backward only to step there.
    if (!policy_.full_gradients || steps_in_backward())
      runner_ = std::make_unique<parallel::shard::UnitRunner>(plan_, *units_, std::move(layout.blocks), trainable_,
                                                              sync_bytes_, trace_);
    if (classifier_) classifier_->set_unit_runner(runner_.get());
  }

  ~ShardedImpl() override {
    if (classifier_) classifier_->set_unit_runner(nullptr);
  }

  std::string name() const override { return policy_.name; }
  const parallel::shard::ShardPlan& plan() const override { return plan_; }
  bool unit_gathered(size_t u) const override { return (*units_)[u].state == parallel::shard::UnitState::kGathered; }
  int64_t gathered_bytes() const override { return units_->gathered_bytes(); }
  void set_tracing(bool on) override {
    trace_.on = on;
    trace_.events.clear();
  }
  std::vector<std::string> trace() const override { return trace_.events; }

  std::vector<std::pair<std::string, at::Tensor>> full_parameters() override {
    std::vector<std::pair<std::string, at::Tensor>> out(trainable_.params.size());
    for (size_t u = 0; u < units_->size(); ++u) {
      units_->ensure_gathered(u);
      for (size_t p : plan_.unit(u).params) out[p] = {trainable_.names[p], trainable_.params[p].detach().clone()};
      if (!(*units_)[u].persistent) units_->free(u);
    }
    return out;
  }

  void build_optimizer(const OptimConfig& cfg) override {
    slices_ = std::make_unique<parallel::shard::OptimizerSlices>(cfg, plan_, *units_, trainable_, comm_->rank());
    if (steps_in_backward()) runner_->set_on_unit_reduced([this](size_t u) { step_unit(u); });
  }
  void freeze(const std::string& name) override { slices_->freeze(name); }

  // zero1 without optim.in_backward reduces at the step only (no runner), so accumulating backward passes
  // need nothing from it.
  std::shared_ptr<void> gradient_sync(bool enabled) override {
    if (enabled || !runner_) return nullptr;
    const bool previous = runner_->sync();
    runner_->set_sync(false);
    return std::shared_ptr<void>(nullptr, [this, previous](void*) { runner_->set_sync(previous); });
  }

  void prepare_step(double lr, const StepOptions& o) override {
    if (!steps_in_backward()) return;
    slices_->set_momentum(o.momentum);
    in_backward_ = InBackward{};
    in_backward_.armed = true;
    in_backward_.lr = lr;
  }

  StepResult step(double lr, const StepOptions& o) override {
    COHORT_ASSERT(slices_, "build_optimizer before step");
    at::NoGradGuard no_grad;
    const InBackward done = std::exchange(in_backward_, InBackward{});
    if (done.units_finished > 0) return finish_step_in_backward(done);
    if (policy_.full_gradients && !runner_) reduce_full_gradients();  // zero1's runner reduced them in backward
    if (options_.broadcast_buffers) broadcast_from_rank0(buffers_, *comm_, name() + " buffers");
    std::vector<at::Tensor> grads;  // float32: the shards themselves, or copies of 16-bit ones
    for (size_t u = 0; u < units_->size(); ++u) grads.push_back((*units_)[u].grad_shard.to(at::kFloat));
    StepResult r = check_and_clip(grads, o);
    if (!r.skipped) {
      slices_->set_momentum(o.momentum);
      slices_->step(lr, grads);
    }
    units_->zero_grads();
    if (!r.skipped) units_->regather_persistent();  // a skipped step left the slices, so the gathers, current
    return r;
  }

  // Under optim.in_backward, as ddp's: units stepped before the last backward ended, and the seconds of
  // slice steps that overlapped a later unit's reduction (hidden) or did not (exposed, an upper bound).
  std::vector<std::pair<std::string, double>> figures() const override {
    if (!steps_in_backward()) return {};
    return {{"in_backward_early_units", static_cast<double>(runner_->finished_in_backward())},
            {"in_backward_hidden_seconds", hidden_seconds_},
            {"in_backward_exposed_seconds", exposed_seconds_}};
  }

  SyncBytes last_sync_bytes() const override { return sync_bytes_; }

  StateBytes state_bytes() const override {
    StateBytes b = units_->state_bytes();
    // Gradients autograd holds outside the shards right now (between a no_sync backward and the step).
    if (!policy_.full_gradients)
      for (const auto& p : trainable_.params)
        if (p.grad().defined()) b.grads += p.grad().numel() * static_cast<int64_t>(p.grad().element_size());
    b.optimizer += slices_ ? slices_->state_bytes() : 0;
    return b;
  }

  StrategyState save_state() override {
    checkpoint::ShardedSave save;
    save.layout = layout();
    slices_->fill_save(save);
    if (comm_->rank() == 0)
      for (size_t i = 0; i < buffers_.size(); ++i) save.buffers.emplace_back(save.layout.buffers[i], buffers_[i]);
    StrategyState out;
    out.shards = std::move(save);
    return out;
  }

  void load_state(const optim::NamedState& optimizer, const checkpoint::NamedTensors&) override {
    COHORT_ASSERT(slices_, "build_optimizer before load_state");
    // The units are gathered again so the weights are the loaded masters (rounded, under fp16-master).
    if (slices_->load(optimizer)) units_->regather_persistent();
  }

 private:
  // What the backward under way has stepped (Note [Sharded steps inside backward]).
  struct InBackward {
    bool armed = false;  // prepare_step() gave this step's learning rate
    double lr = 0;
    size_t units_finished = 0;  // handed over by the runner, stepped or not
    size_t units_stepped = 0;
    bool nonfinite = false;  // this rank's slice of a unit held inf or NaN: it and later ones not stepped
  };

  bool steps_in_backward() const { return options_.in_backward && comm_->size() > 1; }

  void step_unit(size_t u) {
    auto& s = in_backward_;
    if (!s.armed) return;
    ++s.units_finished;
    if (s.nonfinite) return;
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> grad{(*units_)[u].grad_shard.to(at::kFloat)};
    if (amp::unscale_and_check(grad, 1.0)) {
      s.nonfinite = true;
      return;
    }
    const auto t0 = std::chrono::steady_clock::now();
    if (s.units_stepped++ == 0) slices_->begin_step();
    slices_->update(s.lr, u, grad.front());
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    (runner_->reducing_after(u) ? hidden_seconds_ : exposed_seconds_) += took;
  }

  // Every unit was stepped (or stopped at a non-finite slice) during backward: agree on the flag, then
  // gather the updated parameters: the same collectives as step()'s plain path (buffers, the flag's
  // all-reduce, the gathers).
  StepResult finish_step_in_backward(const InBackward& done) {
    if (options_.broadcast_buffers) broadcast_from_rank0(buffers_, *comm_, name() + " buffers");
    auto t = at::tensor({done.nonfinite ? 1.0 : 0.0, done.units_stepped > 0 ? 1.0 : 0.0}, at::kDouble);
    comm_->all_reduce(t, comm::ReduceOp::kSum, "gradient check")->wait();
    StepResult r;
    r.nonfinite = t[0].item<double>() > 0;
    r.updated_in_backward = r.nonfinite && t[1].item<double>() > 0;
    units_->zero_grads();
    units_->regather_persistent();
    return r;
  }

  // Each rank sees only its slices, so an inf in one rank's slice must reach every rank: one all-reduce
  // carries both the sum (finite exactly when every element is) and the squared norm. Shards are
  // disjoint and padding is zero, so the squares summed over ranks are the full norm's.
  // See Note [Every rank skips an overflowed step together].
  StepResult check_and_clip(std::vector<at::Tensor>& grads, const StepOptions& o) {
    const bool local_nonfinite = amp::unscale_and_check(grads, 1.0 / o.loss_scale);
    const double sq = o.clip_norm > 0 ? squared_sum(grads).item<double>() : 0.0;
    auto t = at::tensor({local_nonfinite ? 1.0 : 0.0, sq}, at::kDouble);
    if (comm_->size() > 1) comm_->all_reduce(t, comm::ReduceOp::kSum, "gradient check and norm")->wait();
    StepResult r;
    r.nonfinite = t[0].item<double>() > 0;
    if (o.clip_norm > 0 && !r.nonfinite) {
      r.grad_norm = std::sqrt(t[1].item<double>());
      const double coef = o.clip_norm / (r.grad_norm + 1e-6);
      if (coef < 1)
        for (auto& g : grads) g.mul_(coef);
    }
    r.skipped = r.nonfinite && o.skip_nonfinite;
    return r;
  }

  // zero1: gradients stay whole through backward (as ddp's would); each unit is reduce-scattered now, in
  // place: the slice lands in this rank's chunk of the full gradient, which grad_shard views.
  void reduce_full_gradients() {
    sync_bytes_ = {};
    for (size_t u = 0; u < units_->size(); ++u) units_->launch_reduce(u, (*units_)[u].flat_grad, sync_bytes_);
    units_->wait_reduces();
  }

  checkpoint::ShardLayout layout() const {
    checkpoint::ShardLayout l;
    l.strategy = name();
    for (const auto& item : model_->named_buffers(true)) l.buffers.push_back(item.key());
    for (const auto& unit : plan_.units()) {
      checkpoint::ShardLayout::Unit lu{unit.numel, unit.padded, unit.shard, {}};
      for (size_t k = 0; k < unit.params.size(); ++k) {
        const auto& spec = plan_.params()[unit.params[k]];
        lu.params.push_back({spec.name, spec.shape, spec.numel(), unit.offsets[k]});
      }
      l.units.push_back(std::move(lu));
    }
    return l;
  }

  std::shared_ptr<torch::nn::Module> model_;
  comm::CommunicatorPtr comm_;
  ShardedOptions options_;
  const StagePolicy& policy_;
  models::Classifier* classifier_;
  Trainable trainable_;
  std::vector<at::Tensor> buffers_;
  parallel::shard::ShardPlan plan_;
  parallel::shard::UnitTrace trace_;
  SyncBytes sync_bytes_;
  std::unique_ptr<parallel::shard::FlatUnits> units_;
  std::unique_ptr<parallel::shard::OptimizerSlices> slices_;
  std::unique_ptr<parallel::shard::UnitRunner> runner_;
  InBackward in_backward_;
  double hidden_seconds_ = 0, exposed_seconds_ = 0;  // slice steps in backward since the start
};

}  // namespace

parallel::shard::ShardPlan plan_shards(torch::nn::Module& model, const ShardedOptions& options, int world) {
  const auto specs = trainable_parameters(model, policy_of(options.stage).name).specs();
  return parallel::shard::ShardPlan(specs, parallel::shard::plan_units(model, specs, options).units, world);
}

std::unique_ptr<ShardedStrategy> make_sharded_strategy(std::shared_ptr<torch::nn::Module> model,
                                                       comm::CommunicatorPtr comm, const ShardedOptions& options) {
  return std::make_unique<ShardedImpl>(std::move(model), std::move(comm), options);
}

}  // namespace cohort::parallel::shard

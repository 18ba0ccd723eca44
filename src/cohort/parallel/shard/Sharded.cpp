#include "cohort/parallel/shard/Sharded.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <mutex>

#include <torch/csrc/autograd/engine.h>

#include "cohort/amp/GradScaler.h"
#include "cohort/amp/MasterWeights.h"
#include "cohort/models/Models.h"
#include "cohort/parallel/GradReadyHook.h"
#include "cohort/parallel/shard/Units.h"
#include "cohort/util/Error.h"

namespace cohort {
namespace {

using shard::broadcast_from_rank0;

// Note [Freeing a unit's parameters]
// A unit's parameters are views into one flat buffer (param.set_data), so autograd's saved tensors and
// the module's members all point at that buffer's storage. FSDP frees the storage's memory (and
// allocates it again) without replacing the storage object, as PyTorch's FSDP does with
// storage.resize_(0): every view stays valid and sees the new bytes once they are gathered back.
void release_storage(const at::Tensor& t) {
  auto* impl = t.storage().unsafeGetStorageImpl();
  impl->set_data_ptr_noswap(at::DataPtr(nullptr, t.device()));
  impl->set_nbytes(0);
}

void allocate_storage(const at::Tensor& t, size_t nbytes) {
  auto* impl = t.storage().unsafeGetStorageImpl();
  if (impl->nbytes() == nbytes) return;
  impl->set_data_ptr_noswap(impl->allocator()->allocate(nbytes));
  impl->set_nbytes(nbytes);
}

int64_t bytes_of(const at::Tensor& t) {
  return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0;
}

class ShardedImpl : public ShardedStrategy, public models::UnitRunner {
 public:
  ShardedImpl(std::shared_ptr<torch::nn::Module> model, CommunicatorPtr comm, ShardedOptions options)
      : model_(std::move(model)), comm_(std::move(comm)), options_(options), rank_(comm_->rank()),
        world_(comm_->size()) {
    for (const auto& item : model_->named_parameters(true)) {
      if (!item.value().requires_grad()) continue;
      names_.push_back(item.key());
      params_.push_back(item.value());
    }
    if (params_.empty())
      throw Error(name() + ": the model has no parameters that require grad", "wrap the model itself");
    for (const auto& item : model_->named_buffers(true)) {
      buffer_names_.push_back(item.key());
      buffers_.push_back(item.value());
    }
    shard::check_replicas_match(names_, params_, *comm_, name());
    broadcast_from_rank0(params_, *comm_, name() + " initial parameters");
    broadcast_from_rank0(buffers_, *comm_, name() + " initial buffers");
    // The same walk over the model as plan_shards, so the plan a bench or test predicts is this one.
    const auto specs = shard::trainable_specs(*model_);
    plan_ = shard::ShardPlan(specs, make_units(specs), world_);
    build_units();
    if (options_.stage != ShardStage::kZero1) attach_hooks();
    if (classifier_) classifier_->set_unit_runner(this);
  }

  ~ShardedImpl() override {
    if (classifier_) classifier_->set_unit_runner(nullptr);
  }

  std::string name() const override {
    switch (options_.stage) {
      case ShardStage::kZero1: return "zero1";
      case ShardStage::kZero2: return "zero2";
      case ShardStage::kFsdp: return "fsdp";
    }
    return "sharded";
  }

  const shard::ShardPlan& plan() const override { return plan_; }
  bool unit_gathered(size_t u) const override { return units_.at(u).state == Gather::kGathered; }
  int64_t gathered_bytes() const override {
    int64_t n = 0;
    for (const auto& u : units_) n += static_cast<int64_t>(u.full.storage().nbytes());
    return n;
  }

  void set_tracing(bool on) override {
    tracing_ = on;
    events_.clear();
  }
  std::vector<std::string> trace() const override { return events_; }

  std::vector<std::pair<std::string, at::Tensor>> full_parameters() override {
    std::vector<std::pair<std::string, at::Tensor>> out(params_.size());
    for (size_t u = 0; u < units_.size(); ++u) {
      ensure_gathered(u);
      for (size_t p : plan_.unit(u).params) out[p] = {names_[p], params_[p].detach().clone()};
      if (!units_[u].persistent) free_unit(u);
    }
    return out;
  }

  void build_optimizer(const OptimConfig& cfg) override {
    // The optimizer sees one tensor per piece of a parameter this rank owns, named after the parameter:
    // a view into the master shard with a view into the gradient shard as its .grad, so it updates the
    // shard in place with exactly DDP's per-element arithmetic.
    const auto rule = group_rule(cfg);
    auto all = optim::make_groups(rule);
    slots_.clear();
    for (size_t u = 0; u < units_.size(); ++u) {
      for (const auto& r : plan_.ranges(u, rank_)) {
        auto piece = units_[u].master.narrow(0, r.shard_offset, r.length).detach();
        piece.set_requires_grad(true);
        // 16-bit units get float32 gradients at each step (Note [Sharding 16-bit weights]).
        if (!sixteen_bit(u)) piece.mutable_grad() = units_[u].grad_shard.narrow(0, r.shard_offset, r.length);
        auto& g = all[optim::group_index(names_[r.param], params_[r.param].dim(), rule)];
        g.names.push_back(names_[r.param]);
        g.params.push_back(piece);
        slots_.push_back({u, r, piece});
      }
    }
    std::vector<optim::ParamGroup> groups;
    for (auto& g : all)
      if (!g.params.empty()) groups.push_back(std::move(g));
    optimizer_ = optim::make_optimizer(cfg, std::move(groups));
  }

  void freeze(const std::string& name) override { optimizer_->freeze(name); }

  std::shared_ptr<void> gradient_sync(bool enabled) override {
    if (enabled) return nullptr;
    const bool previous = sync_enabled_;
    sync_enabled_ = false;
    return std::shared_ptr<void>(nullptr, [this, previous](void*) { sync_enabled_ = previous; });
  }

  StepResult step(double lr, const StepOptions& o) override {
    COHORT_ASSERT(optimizer_, "build_optimizer before step");
    at::NoGradGuard no_grad;
    if (options_.stage == ShardStage::kZero1) reduce_full_gradients();
    if (options_.broadcast_buffers) broadcast_from_rank0(buffers_, *comm_, name() + " buffers");
    // Each rank sees only its slices, so an inf in one rank's slice must reach every rank: one
    // all-reduce carries both the sum (finite exactly when every element is) and the squared norm.
    // Shards are disjoint and padding is zero, so the squares summed over ranks are the full norm's.
    // See Note [Every rank skips an overflowed step together].
    std::vector<at::Tensor> grads;  // float32: the shards themselves, or copies of 16-bit ones
    for (const auto& u : units_) grads.push_back(u.grad_shard.to(at::kFloat));
    const bool local_nonfinite = amp::unscale_and_check(grads, 1.0 / o.loss_scale);
    const double sq = o.clip_norm > 0 ? squared_sum(grads).item<double>() : 0.0;
    auto t = at::tensor({local_nonfinite ? 1.0 : 0.0, sq}, at::kDouble);
    if (world_ > 1) comm_->all_reduce(t, ReduceOp::kSum, "gradient check and norm")->wait();
    StepResult r;
    r.nonfinite = t[0].item<double>() > 0;
    if (o.clip_norm > 0 && !r.nonfinite) {
      r.grad_norm = std::sqrt(t[1].item<double>());
      const double coef = o.clip_norm / (r.grad_norm + 1e-6);
      if (coef < 1)
        for (auto& g : grads) g.mul_(coef);
    }
    r.skipped = r.nonfinite && o.skip_nonfinite;
    if (!r.skipped) {
      for (auto& slot : slots_)
        if (sixteen_bit(slot.unit))
          slot.piece.mutable_grad() = grads[slot.unit].narrow(0, slot.range.shard_offset, slot.range.length);
      optimizer_->step(lr);
      for (auto& slot : slots_)
        if (sixteen_bit(slot.unit)) slot.piece.mutable_grad().reset();
    }
    for (auto& u : units_) (u.flat_grad.defined() ? u.flat_grad : u.grad_shard).zero_();
    if (r.skipped) return r;  // the slices did not change, so the gathered parameters are current
    regather_persistent();
    return r;
  }

  SyncBytes last_sync_bytes() const override { return sync_bytes_; }

  StateBytes state_bytes() const override {
    StateBytes b;
    for (const auto& u : units_) {
      // A float32 master is the sharded parameter itself; a 16-bit unit's is optimizer state, as in
      // ZeRO's 12 bytes (and the ddp strategy's masters).
      b.params += static_cast<int64_t>(u.full.storage().nbytes());
      (u.full.scalar_type() == at::kFloat ? b.params : b.optimizer) += bytes_of(u.master);
      b.grads += u.flat_grad.defined() ? bytes_of(u.flat_grad) : bytes_of(u.grad_shard);  // zero1: a view
    }
    // Gradients autograd holds outside the shards right now (between a no_sync backward and the step).
    if (options_.stage != ShardStage::kZero1)
      for (const auto& p : params_) b.grads += bytes_of(p.grad());
    b.optimizer += optimizer_ ? optimizer_->state_bytes() : 0;
    return b;
  }

  bool sharded() const override { return true; }
  optim::NamedState optimizer_state() override {
    throw Error(name() + " keeps optimizer state in shards", "save it with shard_state() and checkpoint::save_sharded");
  }

  ShardState shard_state() override {
    ShardState out;
    const auto kinds = optimizer_->state_kinds();
    std::map<std::string, at::Tensor> state;
    for (auto& [k, t] : optimizer_->state_dict()) state[k] = t;
    for (size_t u = 0; u < units_.size(); ++u) {
      const auto tag = ".u" + std::to_string(u);
      out.tensors.emplace_back("param" + tag, units_[u].master);
      if (state.empty()) continue;
      for (const auto& kind : kinds) {
        auto t = at::zeros({plan_.unit(u).shard}, at::kFloat);
        for (const auto& s : slots_)
          if (s.unit == u) {
            auto it = state.find(kind + "." + names_[s.range.param]);
            if (it != state.end()) t.narrow(0, s.range.shard_offset, s.range.length).copy_(it->second.reshape(-1));
          }
        out.tensors.emplace_back(kind + tag, t);
      }
    }
    if (state.count("step")) out.tensors.emplace_back("step", state["step"]);
    if (rank_ == 0)
      for (size_t i = 0; i < buffers_.size(); ++i) out.tensors.emplace_back("buffer." + buffer_names_[i], buffers_[i]);
    nlohmann::json units = nlohmann::json::array();
    for (size_t u = 0; u < units_.size(); ++u) {
      const auto& unit = plan_.unit(u);
      nlohmann::json ps = nlohmann::json::array();
      for (size_t k = 0; k < unit.params.size(); ++k)
        ps.push_back({{"name", names_[unit.params[k]]}, {"shape", plan_.params()[unit.params[k]].shape},
                      {"offset", unit.offsets[k]}});
      units.push_back({{"numel", unit.numel}, {"padded", unit.padded}, {"shard", unit.shard}, {"params", ps}});
    }
    out.layout = {{"strategy", name()}, {"world_size", world_}, {"optimizer", optimizer_->name()},
                  {"kinds", state.empty() ? std::vector<std::string>{} : kinds},
                  {"buffers", buffer_names_}, {"units", units}};
    return out;
  }

  void load_optimizer_state(const optim::NamedState& full) override {
    COHORT_ASSERT(optimizer_, "build_optimizer before load_optimizer_state");
    std::map<std::string, at::Tensor> by_name(full.begin(), full.end());
    // This rank's piece of the full per-parameter tensor `kind.<name>`, or undefined if none was saved.
    auto slice = [&](const std::string& prefix, const Slot& s) -> at::Tensor {
      const auto key = prefix + names_[s.range.param];
      auto it = by_name.find(key);
      if (it == by_name.end()) return {};
      if (it->second.numel() != plan_.params()[s.range.param].numel())
        throw CheckpointError("optimizer state '" + key + "' has " + std::to_string(it->second.numel()) +
                                  " elements but the parameter has " +
                                  std::to_string(plan_.params()[s.range.param].numel()),
                              "resume with the model configuration the checkpoint was saved with");
      return it->second.reshape(-1).narrow(0, s.range.param_offset, s.range.length);
    };
    optim::NamedState mine;
    for (const auto& kind : optimizer_->state_kinds())
      for (const auto& s : slots_)
        if (auto t = slice(kind + ".", s); t.defined()) mine.emplace_back(kind + "." + names_[s.range.param], t.clone());
    if (by_name.count("step")) mine.emplace_back("step", by_name["step"]);
    optimizer_->load_state_dict(mine);
    // fp16-master's float32 weights (master.<name>: from a ddp save, or a sharded save's weights, which
    // are its masters) become this rank's master slices, more exact than the 16-bit weights rounded
    // from them; the units are gathered again so the weights are the rounded masters.
    // Whether to gather again is a collective decision: taken from the names saved, the same on every
    // rank, not from this rank's slots (a rank may own only padding, or only float32 parameters).
    at::NoGradGuard no_grad;
    for (const auto& s : slots_)
      if (auto t = slice(amp::kMasterPrefix, s); t.defined())
        units_[s.unit].master.narrow(0, s.range.shard_offset, s.range.length).copy_(t);
    const bool masters = std::any_of(names_.begin(), names_.end(),
                                     [&](const std::string& n) { return by_name.count(amp::kMasterPrefix + n) > 0; });
    if (masters) regather_persistent();
  }

  HookState state_dict() override { return {}; }
  void load_state_dict(const HookState&) override {}

  // models::UnitRunner: fsdp's forward path. The root unit (parameters outside every unit: the stem, the
  // head) is gathered when the model's forward starts and, in training, stays gathered until its
  // gradients are reduced at the end of backward, as FSDP2 keeps its root; the other units are gathered
  // around their own forward and backward.
  // A block is one unit, or one per dtype under fp16-master (see parallel/shard/Units.h); the unit
  // numbers in the trace are the plan's.
  at::Tensor run_model(const std::function<at::Tensor()>& forward) override {
    gather_block(0);
    if (blocks_.size() > 1) prefetch_block(1);
    at::Tensor out = forward();
    if (!out.requires_grad()) free_block(0);
    return out;
  }

  at::Tensor run(size_t index, const std::function<at::Tensor()>& forward) override {
    const size_t b = index + 1;
    COHORT_ASSERT(b < blocks_.size(), "model ran unit " + std::to_string(index) + " but fsdp planned " +
                                          std::to_string(blocks_.size() - 1));
    gather_block(b);
    if (b + 1 < blocks_.size()) prefetch_block(b + 1);  // the next block's gather overlaps this forward
    for (size_t u : blocks_[b]) note("forward", u);
    at::Tensor out = forward();
    if (out.requires_grad()) {
      out.register_hook([this, b](const at::Tensor&) { pre_backward(b); });
    }
    free_block(b);
    return out;
  }

 private:
  enum class Gather { kSharded, kGathering, kGathered };
  struct UnitState {
    at::Tensor full;        // the unit's flat parameters; params are views into it
    size_t nbytes = 0;      // full's storage size when allocated
    at::Tensor master;      // this rank's float32 slice, which the optimizer updates
    at::Tensor gather_src;  // 16-bit units: the master rounded to the weights' dtype, while its gather runs
    at::Tensor grad_shard;  // this rank's slice of the averaged gradient
    at::Tensor flat_grad;   // zero1: the full gradients, which params' .grad are views of
    bool persistent = true; // stays gathered (every unit of zero1/zero2, fsdp's root)
    Gather state = Gather::kGathered;
    HandlePtr gather;
    HandlePtr reduce;
    at::Tensor reduce_src;
    size_t pending = 0;
    bool done = false;
  };
  struct Slot {
    size_t unit;
    shard::Range range;
    at::Tensor piece;  // the optimizer's tensor: a view into the unit's master
  };
  bool sixteen_bit(size_t u) const { return units_[u].full.scalar_type() != at::kFloat; }

  std::vector<std::vector<size_t>> make_units(const std::vector<shard::ParamSpec>& specs) {
    if (options_.stage == ShardStage::kFsdp) {
      classifier_ = dynamic_cast<models::Classifier*>(model_.get());
      if (!classifier_)
        throw ConfigError("dist.strategy=fsdp needs a cohort model (a models::Classifier) to find its units",
                          "use zero2 for other modules");
    }
    auto layout = shard::plan_units(*model_, specs, shard::trainable_dtypes(*model_), options_);
    blocks_ = std::move(layout.blocks);
    return std::move(layout.units);
  }

  // Note [Sharding 16-bit weights]
  // Under fp16-master a unit's flat parameters, gradients and gradient collectives are in the weights'
  // dtype (2 bytes, as ZeRO's 2Ψ), while the slice the optimizer updates is a float32 master (ZeRO's
  // 4Ψ/N of the 12). At the step the 16-bit gradient slice is copied to float32 before unscaling (so
  // small gradients do not underflow), the optimizer updates the master, and the gather sends the master
  // rounded to 16 bits. float32 units keep their master as the sharded parameter itself.
  void build_units() {
    at::NoGradGuard no_grad;
    for (size_t u = 0; u < plan_.units().size(); ++u) {
      const auto& unit = plan_.unit(u);
      // Units are single-dtype (Units.h); an empty one takes float32.
      const auto options = unit.params.empty() ? params_.front().options().dtype(at::kFloat)
                                               : params_[unit.params.front()].options();
      UnitState s;
      s.full = at::zeros({unit.padded}, options);
      s.nbytes = static_cast<size_t>(unit.padded) * s.full.element_size();
      for (size_t k = 0; k < unit.params.size(); ++k) {
        auto& p = params_[unit.params[k]];
        const auto type = p.scalar_type();
        if (type != at::kFloat && type != at::kHalf && type != at::kBFloat16)
          throw ConfigError(name() + " shards float32, float16 and bfloat16 parameters; '" + names_[unit.params[k]] +
                                "' is " + std::string(c10::toString(type)),
                            "keep the model in float32 (amp.precision casts at run time)");
        auto view = s.full.narrow(0, unit.offsets[k], p.numel()).view(p.sizes());
        view.copy_(p);
        p.set_data(view);
      }
      s.master = at::empty({unit.shard}, options.dtype(at::kFloat));
      s.master.copy_(s.full.narrow(0, rank_ * unit.shard, unit.shard));
      s.grad_shard = at::zeros({unit.shard}, options);
      s.persistent = options_.stage != ShardStage::kFsdp;
      if (options_.stage == ShardStage::kZero1) {
        s.flat_grad = at::zeros({unit.padded}, options);
        s.grad_shard = s.flat_grad.narrow(0, rank_ * unit.shard, unit.shard);
        for (size_t k = 0; k < unit.params.size(); ++k) {
          auto& p = params_[unit.params[k]];
          p.mutable_grad() = s.flat_grad.narrow(0, unit.offsets[k], p.numel()).view(p.sizes());
        }
      }
      units_.push_back(std::move(s));
    }
    for (size_t u = 0; u < units_.size(); ++u)
      if (!units_[u].persistent) free_unit(u);
  }

  void attach_hooks() {
    fire_ = std::make_shared<std::function<void(size_t)>>([this](size_t i) { on_gradient_ready(i); });
    grad_accumulators_ = attach_grad_ready_hooks(params_, fire_);
  }

  void start_gather(size_t u) {
    auto& s = units_[u];
    if (s.state != Gather::kSharded) return;
    allocate_storage(s.full, s.nbytes);
    if (world_ == 1 || s.full.numel() == 0) {
      s.full.narrow(0, 0, s.master.numel()).copy_(s.master);
      s.state = Gather::kGathered;
      return;
    }
    // The source must outlive the asynchronous gather (Note [Sharding 16-bit weights]).
    s.gather_src = s.master.to(s.full.scalar_type());
    s.gather = comm_->all_gather(s.full, s.gather_src, name() + " unit " + std::to_string(u) + " parameters");
    s.state = Gather::kGathering;
    note("gather", u);
  }

  void ensure_gathered(size_t u) {
    auto& s = units_[u];
    start_gather(u);
    if (s.state == Gather::kGathering) {
      note("wait", u);
      s.gather->wait();
      s.gather.reset();
      s.gather_src = at::Tensor();
      s.state = Gather::kGathered;
    }
  }

  void free_unit(size_t u) {
    auto& s = units_[u];
    if (s.state == Gather::kGathering) s.gather->wait();
    s.gather.reset();
    s.gather_src = at::Tensor();
    release_storage(s.full);
    s.state = Gather::kSharded;
    note("free", u);
  }

  void begin_backward() {
    in_backward_ = true;
    backward_synced_ = sync_enabled_;
    if (backward_synced_) sync_bytes_ = {};
    for (size_t u = 0; u < units_.size(); ++u) {
      units_[u].pending = plan_.unit(u).params.size();
      units_[u].done = false;
    }
    torch::autograd::Engine::get_default_engine().queue_callback([this] { finalize(); });
  }

  // Autograd reached block b's output: its backward is next, so its parameters must be whole, and the
  // block before it (next in backward) starts gathering now.
  void pre_backward(size_t b) {
    if (!in_backward_) begin_backward();
    for (size_t u : blocks_[b]) note("backward", u);
    gather_block(b);
    if (b > 1) prefetch_block(b - 1);
  }

  // Updated slices go back to every rank for the units that stay whole; fsdp's others gather lazily.
  void regather_persistent() {
    for (size_t u = 0; u < units_.size(); ++u)
      if (units_[u].persistent) {
        units_[u].state = Gather::kSharded;
        start_gather(u);
      }
    for (size_t u = 0; u < units_.size(); ++u)
      if (units_[u].persistent) ensure_gathered(u);
  }

  void gather_block(size_t b) {
    for (size_t u : blocks_[b]) start_gather(u);
    for (size_t u : blocks_[b]) ensure_gathered(u);
  }
  void prefetch_block(size_t b) {
    for (size_t u : blocks_[b]) start_gather(u);
  }
  void free_block(size_t b) {
    for (size_t u : blocks_[b])
      if (!units_[u].persistent) free_unit(u);
  }

  void on_gradient_ready(size_t i) {
    if (!in_backward_) begin_backward();
    const size_t u = plan_.unit_of(i);
    auto& s = units_[u];
    if (s.pending > 0 && --s.pending == 0) unit_backward_done(u);
  }

  // Every gradient of unit u is in: average and reduce-scatter them (only the slice stays), free the
  // full gradients and, under fsdp, the parameters.
  void unit_backward_done(size_t u) {
    auto& s = units_[u];
    if (s.done) return;
    s.done = true;
    if (backward_synced_) {
      const auto& unit = plan_.unit(u);
      auto flat = at::zeros({unit.padded}, s.grad_shard.options());
      for (size_t k = 0; k < unit.params.size(); ++k) {
        auto& p = params_[unit.params[k]];
        if (p.grad().defined()) flat.narrow(0, unit.offsets[k], p.numel()).copy_(p.grad().reshape(-1));
        p.mutable_grad().reset();
      }
      launch_reduce(u, flat);
    }
    if (!s.persistent) free_unit(u);
  }

  void launch_reduce(size_t u, at::Tensor flat) {
    auto& s = units_[u];
    if (flat.numel() == 0) return;  // a unit without parameters (a parameter-free block)
    // See Note [Where gradients are divided by world size]: before the sum, as ddp does.
    flat.div_(world_);
    sync_bytes_.dense += bytes_of(flat);
    if (world_ == 1) {
      s.grad_shard.copy_(flat);
      return;
    }
    sync_bytes_.wire += bytes_of(flat) / world_ * (world_ - 1);
    note("reduce", u);
    s.reduce_src = flat;
    s.reduce = comm_->reduce_scatter(s.grad_shard, flat, ReduceOp::kSum,
                                     name() + " unit " + std::to_string(u) + " gradients");
  }

  void finalize() {
    // Units with a parameter that got no gradient never completed: reduce them now (zeros for the missing).
    for (size_t u = 0; u < units_.size(); ++u)
      if (!units_[u].done) unit_backward_done(u);
    for (auto& s : units_)
      if (s.reduce) {
        s.reduce->wait();
        s.reduce.reset();
        s.reduce_src = at::Tensor();
      }
    in_backward_ = false;
  }

  // zero1: gradients stay whole through backward (as ddp's would); each unit is reduce-scattered now, in
  // place: the slice lands in this rank's chunk of the full gradient, which grad_shard views.
  void reduce_full_gradients() {
    sync_bytes_ = {};
    for (size_t u = 0; u < units_.size(); ++u) launch_reduce(u, units_[u].flat_grad);
    for (auto& s : units_) {
      if (s.reduce) s.reduce->wait();
      s.reduce.reset();
      s.reduce_src = at::Tensor();
    }
  }

  std::shared_ptr<torch::nn::Module> model_;
  models::Classifier* classifier_ = nullptr;
  CommunicatorPtr comm_;
  ShardedOptions options_;
  int rank_, world_;
  std::vector<std::string> names_, buffer_names_;
  std::vector<at::Tensor> params_, buffers_;
  shard::ShardPlan plan_;
  std::vector<std::vector<size_t>> blocks_;  // fsdp: the units of each block, the root first
  std::vector<UnitState> units_;
  std::vector<Slot> slots_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  std::shared_ptr<std::function<void(size_t)>> fire_;
  std::vector<std::shared_ptr<void>> grad_accumulators_;
  void note(const char* what, size_t u) {
    if (tracing_) events_.push_back(std::string(what) + " " + std::to_string(u));
  }

  bool tracing_ = false;
  std::vector<std::string> events_;
  bool sync_enabled_ = true;
  bool in_backward_ = false;
  bool backward_synced_ = true;
  SyncBytes sync_bytes_;
};

}  // namespace

shard::ShardPlan plan_shards(torch::nn::Module& model, const ShardedOptions& options, int world) {
  const auto specs = shard::trainable_specs(model);
  return shard::ShardPlan(specs, shard::plan_units(model, specs, shard::trainable_dtypes(model), options).units, world);
}

std::unique_ptr<ShardedStrategy> make_sharded_strategy(std::shared_ptr<torch::nn::Module> model, CommunicatorPtr comm,
                                                       const ShardedOptions& options) {
  return std::make_unique<ShardedImpl>(std::move(model), std::move(comm), options);
}

}  // namespace cohort

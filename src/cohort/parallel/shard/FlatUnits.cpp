#include "cohort/parallel/shard/FlatUnits.h"

#include "cohort/util/Error.h"

namespace cohort::parallel::shard {
namespace {

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

int64_t bytes_of(const at::Tensor& t) { return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0; }

}  // namespace

FlatUnits::FlatUnits(const ShardPlan& plan, const Trainable& trainable, comm::Communicator& comm, UnitOptions options,
                     std::string who, UnitTrace* trace)
    : comm_(comm), options_(options), who_(std::move(who)), trace_(trace), rank_(comm.rank()), world_(comm.size()) {
  at::NoGradGuard no_grad;
  for (const auto& unit : plan.units()) units_.push_back(build_unit(unit, trainable));
  for (size_t u = 0; u < units_.size(); ++u)
    if (!units_[u].persistent) free(u);
}

// Note [Sharding 16-bit weights]
// Under fp16-master a unit's flat parameters, gradients and gradient collectives are in the weights'
// dtype (2 bytes, as ZeRO's 2Ψ), while the slice the optimizer updates is a float32 master (ZeRO's
// 4Ψ/N of the 12). At the step the 16-bit gradient slice is copied to float32 before unscaling (so
// small gradients do not underflow), the optimizer updates the master, and the gather sends the master
// rounded to 16 bits. float32 units keep their master as the sharded parameter itself.
FlatUnit FlatUnits::build_unit(const Unit& unit, const Trainable& trainable) {
  const auto& params = trainable.params;
  // Units are single-dtype (Units.h); an empty one takes float32.
  const auto options =
      unit.params.empty() ? params.front().options().dtype(at::kFloat) : params[unit.params.front()].options();
  FlatUnit s;
  s.full = at::zeros({unit.padded}, options);
  s.nbytes = static_cast<size_t>(unit.padded) * s.full.element_size();
  for (size_t k = 0; k < unit.params.size(); ++k) {
    auto p = params[unit.params[k]];
    const auto type = p.scalar_type();
    if (type != at::kFloat && type != at::kHalf && type != at::kBFloat16)
      throw ConfigError(who_ + " shards float32, float16 and bfloat16 parameters; '" + trainable.names[unit.params[k]] +
                            "' is " + std::string(c10::toString(type)),
                        "keep the model in float32 (amp.precision casts at run time)");
    auto view = s.full.narrow(0, unit.offsets[k], p.numel()).view(p.sizes());
    view.copy_(p);
    p.set_data(view);
  }
  s.master = at::empty({unit.shard}, options.dtype(at::kFloat));
  s.master.copy_(s.full.narrow(0, rank_ * unit.shard, unit.shard));
  s.grad_shard = at::zeros({unit.shard}, options);
  s.persistent = options_.persistent;
  if (options_.full_gradients) {
    s.flat_grad = at::zeros({unit.padded}, options);
    s.grad_shard = s.flat_grad.narrow(0, rank_ * unit.shard, unit.shard);
    for (size_t k = 0; k < unit.params.size(); ++k) {
      auto p = params[unit.params[k]];
      p.mutable_grad() = s.flat_grad.narrow(0, unit.offsets[k], p.numel()).view(p.sizes());
    }
  }
  return s;
}

void FlatUnits::start_gather(size_t u) {
  auto& s = units_[u];
  if (s.state != UnitState::kSharded) return;
  allocate_storage(s.full, s.nbytes);
  if (world_ == 1 || s.full.numel() == 0) {
    s.full.narrow(0, 0, s.master.numel()).copy_(s.master);
    s.state = UnitState::kGathered;
    return;
  }
  // The source must outlive the asynchronous gather (Note [Sharding 16-bit weights]).
  s.gather_src = s.master.to(s.full.scalar_type());
  s.gather = comm_.all_gather(s.full, s.gather_src, who_ + " unit " + std::to_string(u) + " parameters");
  s.state = UnitState::kGathering;
  trace_->note("gather", u);
}

void FlatUnits::ensure_gathered(size_t u) {
  auto& s = units_[u];
  start_gather(u);
  if (s.state != UnitState::kGathering) return;
  trace_->note("wait", u);
  s.gather->wait();
  s.gather.reset();
  s.gather_src = at::Tensor();
  s.state = UnitState::kGathered;
}

void FlatUnits::free(size_t u) {
  auto& s = units_[u];
  if (s.state == UnitState::kGathering) s.gather->wait();
  s.gather.reset();
  s.gather_src = at::Tensor();
  release_storage(s.full);
  s.state = UnitState::kSharded;
  trace_->note("free", u);
}

void FlatUnits::regather_persistent() {
  for (size_t u = 0; u < units_.size(); ++u)
    if (units_[u].persistent) {
      units_[u].state = UnitState::kSharded;
      start_gather(u);
    }
  for (size_t u = 0; u < units_.size(); ++u)
    if (units_[u].persistent) ensure_gathered(u);
}

void FlatUnits::launch_reduce(size_t u, at::Tensor flat, SyncBytes& bytes) {
  auto& s = units_[u];
  if (flat.numel() == 0) return;  // a unit without parameters (a parameter-free block)
  // See Note [Where gradients are divided by world size]: before the sum, as ddp does.
  flat.div_(world_);
  bytes.dense += bytes_of(flat);
  if (world_ == 1) {
    s.grad_shard.copy_(flat);
    return;
  }
  bytes.wire += bytes_of(flat) / world_ * (world_ - 1);
  trace_->note("reduce", u);
  s.reduce_src = flat;
  s.reduce = comm_.reduce_scatter(s.grad_shard, flat, comm::ReduceOp::kSum,
                                  who_ + " unit " + std::to_string(u) + " gradients");
}

bool FlatUnits::reduce_done(size_t u) const { return !units_[u].reduce || units_[u].reduce->is_completed(); }

void FlatUnits::wait_reduce(size_t u) {
  auto& s = units_[u];
  if (s.reduce) s.reduce->wait();
  s.reduce.reset();
  s.reduce_src = at::Tensor();
}

void FlatUnits::wait_reduces() {
  for (size_t u = 0; u < units_.size(); ++u) wait_reduce(u);
}

void FlatUnits::zero_grads() {
  for (auto& s : units_) (s.flat_grad.defined() ? s.flat_grad : s.grad_shard).zero_();
}

int64_t FlatUnits::gathered_bytes() const {
  int64_t n = 0;
  for (const auto& s : units_) n += static_cast<int64_t>(s.full.storage().nbytes());
  return n;
}

StateBytes FlatUnits::state_bytes() const {
  StateBytes b;
  for (const auto& s : units_) {
    // A float32 master is the sharded parameter itself; a 16-bit unit's is optimizer state, as in
    // ZeRO's 12 bytes (and the ddp strategy's masters).
    b.params += static_cast<int64_t>(s.full.storage().nbytes());
    (s.sixteen_bit() ? b.optimizer : b.params) += bytes_of(s.master);
    b.grads += s.flat_grad.defined() ? bytes_of(s.flat_grad) : bytes_of(s.grad_shard);  // zero1: a view
  }
  return b;
}

}  // namespace cohort::parallel::shard

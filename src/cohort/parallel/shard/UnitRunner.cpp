#include "cohort/parallel/shard/UnitRunner.h"

#include <torch/csrc/autograd/engine.h>

#include "cohort/parallel/GradReadyHook.h"
#include "cohort/util/Error.h"

namespace cohort::parallel::shard {

UnitRunner::UnitRunner(const ShardPlan& plan, FlatUnits& units, std::vector<std::vector<size_t>> blocks,
                       const Trainable& trainable, SyncBytes& bytes, UnitTrace& trace)
    : plan_(plan),
      units_(units),
      blocks_(std::move(blocks)),
      params_(trainable.params),
      bytes_(bytes),
      trace_(trace),
      pending_(units.size(), 0),
      reduced_(units.size(), false) {
  fire_ = std::make_shared<std::function<void(size_t)>>([this](size_t i) { on_gradient_ready(i); });
  grad_accumulators_ = attach_grad_ready_hooks(params_, fire_);
}

at::Tensor UnitRunner::run_model(const std::function<at::Tensor()>& forward) {
  gather_block(0);
  if (blocks_.size() > 1) prefetch_block(1);
  at::Tensor out = forward();
  if (!out.requires_grad()) free_block(0);
  return out;
}

// A block is one unit, or one per dtype under fp16-master (Units.h); the trace numbers units.
at::Tensor UnitRunner::run(size_t index, const std::function<at::Tensor()>& forward) {
  const size_t b = index + 1;
  COHORT_ASSERT(b < blocks_.size(),
                "model ran unit " + std::to_string(index) + " but fsdp planned " + std::to_string(blocks_.size() - 1));
  gather_block(b);
  if (b + 1 < blocks_.size()) prefetch_block(b + 1);  // the next block's gather overlaps this forward
  for (size_t u : blocks_[b]) trace_.note("forward", u);
  at::Tensor out = forward();
  if (out.requires_grad()) out.register_hook([this, b](const at::Tensor&) { pre_backward(b); });
  free_block(b);
  return out;
}

void UnitRunner::begin_backward() {
  pass_ = sync_ ? Pass::kBackwardSynced : Pass::kBackwardLocal;
  if (pass_ == Pass::kBackwardSynced) bytes_ = {};
  for (size_t u = 0; u < units_.size(); ++u) {
    pending_[u] = plan_.unit(u).params.size();
    reduced_[u] = false;
  }
  order_.clear();
  next_to_finish_ = 0;
  if (pass_ == Pass::kBackwardSynced) finished_in_backward_ = 0;
  torch::autograd::Engine::get_default_engine().queue_callback([this] { finish_backward(); });
}

// Autograd reached block b's output: its backward is next, so its parameters must be whole, and the
// block before it (next in backward) starts gathering now.
void UnitRunner::pre_backward(size_t b) {
  if (pass_ == Pass::kIdle) begin_backward();
  for (size_t u : blocks_[b]) trace_.note("backward", u);
  gather_block(b);
  if (b > 1) prefetch_block(b - 1);
}

void UnitRunner::on_gradient_ready(size_t i) {
  if (pass_ == Pass::kIdle) begin_backward();
  const size_t u = plan_.unit_of(i);
  if (pending_[u] > 0 && --pending_[u] == 0) unit_backward_done(u);
  if (on_unit_reduced_ && pass_ == Pass::kBackwardSynced) finish_completed_units();
}

// Every gradient of unit u is in: average and reduce-scatter them (only the slice stays), drop the full
// gradients and, under fsdp, the parameters. zero1's gradients are views of the unit's flat gradient,
// reduced in place and kept.
void UnitRunner::unit_backward_done(size_t u) {
  if (reduced_[u]) return;
  reduced_[u] = true;
  if (pass_ == Pass::kBackwardSynced && units_[u].flat_grad.defined()) {
    units_.launch_reduce(u, units_[u].flat_grad, bytes_);
    order_.push_back(u);
  } else if (pass_ == Pass::kBackwardSynced) {
    const auto& unit = plan_.unit(u);
    auto flat = at::zeros({unit.padded}, units_[u].grad_shard.options());
    for (size_t k = 0; k < unit.params.size(); ++k) {
      auto& p = params_[unit.params[k]];
      if (p.grad().defined()) flat.narrow(0, unit.offsets[k], p.numel()).copy_(p.grad().reshape(-1));
      p.mutable_grad().reset();
    }
    units_.launch_reduce(u, flat, bytes_);
    order_.push_back(u);
  }
  if (!units_[u].persistent) units_.free(u);
}

void UnitRunner::finish_backward() {
  // Units with a parameter that got no gradient never completed: reduce them now (zeros for the missing).
  for (size_t u = 0; u < units_.size(); ++u)
    if (!reduced_[u]) unit_backward_done(u);
  if (on_unit_reduced_)
    while (next_to_finish_ < order_.size()) finish_unit(order_[next_to_finish_++]);
  units_.wait_reduces();
  pass_ = Pass::kIdle;
}

// In reduction order, so every rank hands its units over in the same order (what the strategy does with
// them issues no collective, so the moment each rank does it may differ).
void UnitRunner::finish_completed_units() {
  while (next_to_finish_ < order_.size() && units_.reduce_done(order_[next_to_finish_])) {
    finish_unit(order_[next_to_finish_++]);
    ++finished_in_backward_;
  }
}

void UnitRunner::finish_unit(size_t u) {
  units_.wait_reduce(u);
  on_unit_reduced_(u);
}

bool UnitRunner::reducing_after(size_t u) const {
  for (size_t v = 0; v < units_.size(); ++v)
    if (!reduced_[v]) return true;
  bool after = false;
  for (size_t v : order_) {
    if (after && !units_.reduce_done(v)) return true;
    after = after || v == u;
  }
  return false;
}

void UnitRunner::gather_block(size_t b) {
  for (size_t u : blocks_[b]) units_.start_gather(u);
  for (size_t u : blocks_[b]) units_.ensure_gathered(u);
}

void UnitRunner::prefetch_block(size_t b) {
  for (size_t u : blocks_[b]) units_.start_gather(u);
}

void UnitRunner::free_block(size_t b) {
  for (size_t u : blocks_[b])
    if (!units_[u].persistent) units_.free(u);
}

}  // namespace cohort::parallel::shard

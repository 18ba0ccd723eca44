#include "cohort/parallel/ddp/Reducer.h"

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include <torch/csrc/autograd/engine.h>

#include "cohort/parallel/GradReadyHook.h"
#include "cohort/util/Error.h"

namespace cohort::parallel::ddp {

// The hooks hold this instead of a raw Reducer pointer: autograd may keep a parameter's accumulator
// (and so our hook) alive after the Reducer is gone, and a hook must then do nothing.
struct Reducer::HookState {
  std::mutex mutex;
  Reducer* reducer = nullptr;
  std::function<void(size_t)> fire;  // what the hooks call; locks `mutex`, does nothing once reducer is null
};

Reducer::Reducer(std::vector<at::Tensor> params, std::vector<std::string> names, comm::CommunicatorPtr comm,
                 ReducerOptions options)
    : params_(std::move(params)),
      names_(std::move(names)),
      comm_(std::move(comm)),
      options_(options),
      hook_(std::make_shared<AllReduceHook>()),
      hook_state_(std::make_shared<HookState>()) {
  COHORT_ASSERT(params_.size() == names_.size(), "one name per parameter");
  std::vector<ParamSpec> specs;
  for (size_t i = 0; i < params_.size(); ++i)
    specs.push_back({names_[i], params_[i].sizes().vec(), params_[i].scalar_type()});
  plan_ =
      plan_buckets(specs, options_.bucket_cap_bytes, options_.first_bucket_cap_bytes, options_.last_bucket_cap_bytes);
  locator_.resize(params_.size());
  for (size_t b = 0; b < plan_.size(); ++b) {
    Bucket bucket;
    bucket.grad.index = b;
    bucket.grad.buffer = at::zeros({plan_[b].numel}, params_.front().options().dtype(plan_[b].dtype));
    for (size_t k = 0; k < plan_[b].params.size(); ++k) {
      const size_t i = plan_[b].params[k];
      locator_[i] = {b, k};
      bucket.grad.grads.push_back(
          bucket.grad.buffer.narrow(0, plan_[b].offsets[k], params_[i].numel()).view(params_[i].sizes()));
      bucket.grad.names.push_back(names_[i]);
    }
    buckets_.push_back(std::move(bucket));
  }
  ready_.assign(params_.size(), false);
  read_skip_fault();

  hook_state_->reducer = this;
  hook_state_->fire = [state = hook_state_.get()](size_t index) {
    std::lock_guard<std::mutex> lock(state->mutex);
    if (state->reducer) state->reducer->on_gradient_ready(index);
  };
  for (size_t i = 0; i < params_.size(); ++i)
    COHORT_ASSERT(params_[i].requires_grad(), "DDP parameters must require grad: " + names_[i]);
  // The hooks hold the function weakly through its HookState (an aliasing pointer).
  grad_accumulators_ =
      attach_grad_ready_hooks(params_, std::shared_ptr<std::function<void(size_t)>>(hook_state_, &hook_state_->fire));
}

Reducer::~Reducer() {
  std::lock_guard<std::mutex> lock(hook_state_->mutex);
  hook_state_->reducer = nullptr;
}

void Reducer::set_comm_hook(std::shared_ptr<CommHook> hook) {
  COHORT_ASSERT(!in_backward_, "set_comm_hook during backward");
  hook_ = std::move(hook);
  std::vector<GradBucket> view;
  for (const auto& b : buckets_) view.push_back(b.grad);
  hook_->attach(view, *comm_);
}

double Reducer::since_start() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void Reducer::on_gradient_ready(size_t index) {
  if (!sync_enabled_ || comm_->size() == 1) return;
  if (!in_backward_) begin_backward();
  mark_ready(index);
  trace_.last_hook_s = since_start();
  if (!options_.overlap) return;
  launch_ready_buckets();
  // A hook whose wait() issues collectives of its own (PowerSGD) is finished only after backward, when
  // every rank finishes its buckets in the same order (Note [Buckets launch in the same order on every rank]).
  if (on_bucket_reduced_ && !hook_->wait_issues_collectives()) finish_completed_buckets();
}

// A test's fault (comm/FaultInjection.h): this rank leaves one bucket of one step out, as a rank whose
// code took another branch would; the ranks' collectives then part (docs/doctor.md).
void Reducer::read_skip_fault() {
  const char* skip = std::getenv("COHORT_FAULT_SKIP_BUCKET");
  const char* rank = std::getenv("COHORT_FAULT_RANK");
  if (!skip || comm_->rank() != (rank ? std::atoi(rank) : 1)) return;
  if (std::sscanf(skip, "%" SCNd64 ":%" SCNd64, &skip_step_, &skip_bucket_) != 2) skip_step_ = skip_bucket_ = -1;
}

void Reducer::begin_backward() {
  ++backwards_;
  in_backward_ = true;
  start_ = std::chrono::steady_clock::now();
  trace_ = BackwardTrace{};
  next_to_launch_ = 0;
  next_to_finish_ = 0;
  std::fill(ready_.begin(), ready_.end(), false);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    buckets_[b].pending = plan_[b].params.size();
    buckets_[b].launched = false;
    buckets_[b].handle.reset();
  }
  // Runs when this backward pass has finished every node, before backward() returns.
  torch::autograd::Engine::get_default_engine().queue_callback([this] {
    std::lock_guard<std::mutex> lock(hook_state_->mutex);
    finalize();
  });
  // See Note [Buckets launch in the same order on every rank]: this collective, too, is launched at the
  // same point on every rank, before bucket 0.
  if (before_sync_) before_sync_();
}

void Reducer::mark_ready(size_t index) {
  if (ready_[index]) return;  // a parameter used twice fires once per backward (AccumulateGrad sums)
  ready_[index] = true;
  const auto [b, k] = locator_[index];
  buckets_[b].grad.grads[k].copy_(params_[index].grad());
  --buckets_[b].pending;
}

// See Note [Buckets launch in the same order on every rank].
void Reducer::launch_ready_buckets() {
  while (next_to_launch_ < buckets_.size() && buckets_[next_to_launch_].pending == 0) launch(next_to_launch_++);
}

void Reducer::launch(size_t b) {
  auto& gb = buckets_[b].grad;
  gb.wire_bytes = 0;
  if (backwards_ == skip_step_ && static_cast<int64_t>(b) == skip_bucket_) {
    std::cerr << "cohort: rank " << comm_->rank() << " leaves out bucket " << b << "'s all-reduce at step "
              << backwards_ << " (COHORT_FAULT_SKIP_BUCKET)" << std::endl;
    buckets_[b].handle = comm::deferred([] {});
  } else {
    buckets_[b].handle = hook_->run(*comm_, gb);
  }
  buckets_[b].launched = true;
  trace_.bucket_launch_s.push_back(since_start());
  trace_.bytes_reduced += gb.wire_bytes;
  trace_.bytes_dense += gb.buffer.numel() * static_cast<int64_t>(gb.buffer.element_size());
}

bool Reducer::reducing_after(size_t b) {
  for (size_t j = b + 1; j < buckets_.size(); ++j)
    if (!buckets_[j].launched || !buckets_[j].handle->is_completed()) return true;
  return false;
}

void Reducer::finish_completed_buckets() {
  while (next_to_finish_ < next_to_launch_ && buckets_[next_to_finish_].handle->is_completed()) {
    finish(next_to_finish_++);
    ++trace_.finished_in_backward;
  }
}

void Reducer::finish(size_t b) {
  buckets_[b].handle->wait();
  for (size_t k = 0; k < plan_[b].params.size(); ++k) {
    auto& p = params_[plan_[b].params[k]];
    const auto& avg = buckets_[b].grad.grads[k];
    if (p.grad().defined())
      p.mutable_grad().copy_(avg);
    else
      p.mutable_grad() = avg.clone();
  }
  if (on_bucket_reduced_) on_bucket_reduced_(b);
}

void Reducer::finalize() {
  in_backward_ = false;
  trace_.finalize_s = since_start();
  std::vector<size_t> missing;
  for (size_t i = 0; i < params_.size(); ++i)
    if (!ready_[i]) missing.push_back(i);
  if (!missing.empty()) {
    if (!options_.find_unused_parameters) {
      std::string list;
      for (size_t n = 0; n < missing.size() && n < 10; ++n) list += (n ? ", " : "") + names_[missing[n]];
      if (missing.size() > 10) list += ", ... (" + std::to_string(missing.size()) + " in all)";
      // This runs inside autograd, which rethrows it as a plain c10::Error: the hint goes in the message.
      throw CommError("rank " + std::to_string(comm_->rank()) +
                      ": these parameters got no gradient in backward: " + list +
                      ". They were not used to compute the loss: set dist.find_unused_parameters=true "
                      "(DdpOptions::find_unused_parameters) to reduce them as zeros, or remove them from the model");
    }
    // An unused parameter contributes zeros, so ranks that did use it still get the right average.
    for (size_t i : missing) {
      const auto [b, k] = locator_[i];
      buckets_[b].grad.grads[k].zero_();
      ready_[i] = true;
      --buckets_[b].pending;
    }
  }
  launch_ready_buckets();
  COHORT_ASSERT(next_to_launch_ == buckets_.size(), "every bucket launched by the end of backward");
  while (next_to_finish_ < buckets_.size()) finish(next_to_finish_++);
  hook_->end_of_backward();
  if (after_sync_) after_sync_();
}

}  // namespace cohort::parallel::ddp

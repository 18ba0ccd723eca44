// What watches a training step without being part of it: the phase clock (where the time goes), the
// step trace (log.trace_steps), the sample of model-state bytes in the session's first step, the metric
// window of the log, and the faults the tests inject. The step in TrainingRun.cpp calls it at named
// points, so that the step reads top to bottom as the ML it does, as llm.c's loop keeps its timing to a
// line or two (see Note [The step and what watches it]).
//
//   StepWatch watch(clock, trace, window, FaultPlan::from_env(), info, *world.comm);
//   watch.step_begins(step + 1);
//   watch.batch_begins(step + 1);                 // the data phase; an injected stall or delay lands here
//   watch.forward_begins();  ...  watch.backward_begins();  ...
//   watch.batch_done(logits, labels, loss, sample ? &strategy : nullptr);
//   watch.gradients_ready(model, step + 1);
//   watch.optimizer_begins();  ...  watch.optimizer_done();
//   watch.step_done(step + 1, sample ? &strategy : nullptr);
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include "cohort/comm/FaultInjection.h"
#include "cohort/comm/WorldInfo.h"
#include "cohort/parallel/Strategy.h"
#include "cohort/record/Metrics.h"
#include "cohort/record/PhaseClock.h"
#include "cohort/record/StepTrace.h"

namespace cohort::train {

// Note [The step and what watches it]
// The step (TrainingRun::train_step and optimizer_step) is the ML: a batch, forward under the precision's
// autocast, the loss, backward with the gradients synchronized on the last micro-batch, the strategy's
// update. Everything else that happens at those moments is a named call on StepWatch, which owns or
// holds each watcher and decides nothing about training: the phase clock's switches, the trace's step
// marks, the window's loss and accuracy sums, the state bytes (the largest seen in the session's first
// step, after each backward and after the update, when gradients and then optimizer state exist), and
// the faults of FaultInjection.h. The calls sit where the code before them sat, so a run's numbers and
// its phases are what they were; a new watcher is a line here, not a line in the step.
class StepWatch {
 public:
  StepWatch(record::PhaseClock& clock, record::StepTrace& trace, record::MetricWindow& window, comm::FaultPlan faults,
            const comm::WorldInfo& info, comm::Communicator& comm)
      : clock_(clock), trace_(trace), window_(window), faults_(std::move(faults)), info_(info), comm_(comm) {}

  void step_begins(int64_t step) { trace_.step_began(step); }
  void batch_begins(int64_t step) {
    clock_.switch_to(record::Phase::kData);
    faults_.before_batch(info_.rank, step, comm_);
  }
  void forward_begins() { clock_.switch_to(record::Phase::kForward); }
  void backward_begins() { clock_.switch_to(record::Phase::kBackward); }
  // After a micro-batch's backward. `sample`: the strategy whose state bytes to sample (the session's
  // first step), else null.
  void batch_done(const at::Tensor& logits, const at::Tensor& labels, double loss, const parallel::Strategy* sample) {
    if (sample) sample_state_bytes(*sample);
    window_.add(logits, labels, loss);
  }
  void gradients_ready(torch::nn::Module& model, int64_t step) { faults_.after_backward(model, info_.rank, step); }
  void optimizer_begins() { clock_.switch_to(record::Phase::kOptimizer); }
  void optimizer_done() { clock_.switch_to(record::Phase::kOther); }
  // After the update of step `step` (counted from 1).
  void step_done(int64_t step, const parallel::Strategy* sample) {
    faults_.after_step(info_.rank, step, info_.restart_count);
    if (sample) sample_state_bytes(*sample);
    trace_.step_ended(step);
  }

  const parallel::StateBytes& state_bytes() const { return state_bytes_; }

 private:
  void sample_state_bytes(const parallel::Strategy& strategy) {
    const parallel::StateBytes b = strategy.state_bytes();
    state_bytes_ = {std::max(state_bytes_.params, b.params), std::max(state_bytes_.grads, b.grads),
                    std::max(state_bytes_.optimizer, b.optimizer)};
  }

  record::PhaseClock& clock_;
  record::StepTrace& trace_;
  record::MetricWindow& window_;
  comm::FaultPlan faults_;
  const comm::WorldInfo& info_;
  comm::Communicator& comm_;
  parallel::StateBytes state_bytes_;
};

}  // namespace cohort::train

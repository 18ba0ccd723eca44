// The one interface the training loop talks to for data parallelism: ddp (full replicas, gradients
// all-reduced in buckets during backward), zero1, zero2 and fsdp (optimizer state, then gradients, then
// parameters sharded across ranks), and swarm (peers that come and go, parallel/swarm/). The strategy owns the
// optimizer, because what a rank updates (the whole model or its slice) is the strategy's business, so the loop in
// train/Trainer.cpp and the step in train/TrainingRun.cpp read the same for every strategy.
//
//   auto strategy = cohort::train::make_strategy(cfg, model, world.comm);   // train/StrategyFactory.h
//   strategy->build_optimizer(cfg.optim);
//   { auto sync = strategy->gradient_sync(last_micro_batch); loss.backward(); }
//   strategy->step(lr, {.clip_norm = cfg.optim.clip_grad_norm});   // clip, update, clear gradients
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch/nn/module.h>

#include "cohort/checkpoint/ShardedCheckpoint.h"
#include "cohort/comm/Communicator.h"
#include "cohort/config/Config.h"
#include "cohort/optim/Optimizer.h"
#include "cohort/util/OldNames.h"  // the names of the last release, for programs outside this tree

namespace cohort::parallel::ddp {
class CommHook;
}

namespace cohort::parallel {

// Bytes this rank put into gradient collectives in the last synchronized backward, and what an
// uncompressed all-reduce of the same gradients would have sent.
struct SyncBytes {
  int64_t wire = 0;
  int64_t dense = 0;
};

// Model-state bytes this rank holds: parameters (full replicas, gathered units and master shards),
// gradients (full or sharded) and optimizer state. Measured from the tensors, not from a formula.
struct StateBytes {
  int64_t params = 0;
  int64_t grads = 0;
  int64_t optimizer = 0;
  int64_t total() const { return params + grads + optimizer; }
};

// What a strategy hands a checkpoint. The checkpoint format is checkpoint/'s business: a strategy hands
// over tensors (and, when sharded, their layout), never files.
struct StrategyState {
  // Unsharded: the optimizer's per-parameter state ("<kind>.<param>", "step") and fp16-master's masters.
  optim::NamedState optimizer;
  // Sharded: this rank's slices and the layout that reassembles them (`optimizer` is then empty).
  std::optional<checkpoint::ShardedSave> shards;
  // State beyond those that an exact resume needs (a compression hook's residuals), on rank 0.
  checkpoint::NamedTensors resume;
};

// Note [Every rank skips an overflowed step together]
// Under fp16 loss scaling an inf or NaN gradient on any rank, in any shard, means the scale was too
// high: every rank must skip the same update, or the replicas drift apart. So the flag is reduced
// across ranks (a max, or a sum with the norm) before anything is decided, and the scaler updates from
// that agreed flag on every rank alike.
struct StepOptions {
  double clip_norm = 0;         // clip to this global L2 norm (0: no clipping)
  bool skip_nonfinite = false;  // a non-finite gradient on any rank skips the update everywhere (fp16 loss scaling)
  double loss_scale = 1.0;      // the gradients are divided by this first (amp::GradScaler's scale)
  int64_t step = 0;             // the step this update makes, counted from 0 (the swarm's round)
  bool last = false;            // the run's last step (train.max_steps or the schedule's end): DiLoCo closes its round
  double momentum = -1;  // this step's SGD momentum or AdamW beta1 (Schedule::momentum); < 0: the optimizer's own
};

// The sum of squares of the defined tensors, in float64 on their device: one host sync for whoever
// reads it, however many tensors (a global gradient norm is its square root).
at::Tensor squared_sum(const std::vector<at::Tensor>& tensors);

struct StepResult {
  double grad_norm = -1;   // the global norm before clipping, when clipping computed it
  bool nonfinite = false;  // some gradient element on some rank was inf or NaN (every rank gets the same answer)
  bool skipped = false;    // the update was skipped because of it
  // false: the batch was only accumulated (the swarm waits for its peers' samples: Note [A swarm step
  // accumulates until the swarm is ready] in parallel/swarm/SwarmStrategy.cpp); call step() again after
  // the next batch's backward. Every other strategy applies an update at every call.
  bool applied = true;
  // optim.in_backward moved some parameters during backward before a non-finite bucket stopped it.
  bool updated_in_backward = false;
};

class Strategy {
 public:
  virtual ~Strategy() = default;
  virtual std::string name() const = 0;
  // Builds the optimizer over what this rank updates. Call once, before the first step.
  virtual void build_optimizer(const OptimConfig& cfg) = 0;
  // Gradients produced while the returned guard lives are synchronized across ranks only if `enabled`
  // (gradient accumulation disables it on all but the last micro-batch).
  virtual std::shared_ptr<void> gradient_sync(bool enabled) = 0;
  // Announces the update the next synchronized backward ends with, before that backward runs: a strategy
  // that steps inside backward (optim.in_backward) needs its learning rate then. step() still follows,
  // with the same arguments. Without this call every strategy steps in step().
  virtual void prepare_step(double lr, const StepOptions& options) {}
  // Checks the gradients for inf/NaN across all ranks and shards, clips them by their global L2 norm,
  // updates the parameters (unless skipped) and clears the gradients. Collective.
  virtual StepResult step(double lr, const StepOptions& options) = 0;
  // Stops updating the named parameter (see optim::Optimizer::freeze). Every rank calls it alike.
  virtual void freeze(const std::string& param_name) = 0;
  virtual SyncBytes last_sync_bytes() const = 0;
  virtual StateBytes state_bytes() const = 0;
  // Figures of the strategy's own that each log window and summary.json add (the swarm's rounds, group
  // sizes, bytes), by name. Most strategies have none.
  virtual std::vector<std::pair<std::string, double>> figures() const { return {}; }

  // Checkpoints. Collective: every rank calls it at the same point (each rank's shards; a compression
  // hook gathers every rank's residuals).
  virtual StrategyState save_state() = 0;
  // A peer that joins a swarm already under way: brings this rank's model and optimizer to the state of
  // live peers ahead of `step` and returns their step (the loop continues from there). Collective.
  // Strategies with a fixed world have nobody to catch up with.
  virtual std::optional<int64_t> catch_up(int64_t step) { return std::nullopt; }
  // Loads from full, per-parameter state ("momentum_buffer.<param>", "master.<param>"), which is what any
  // checkpoint reassembles to, so a run can resume under another strategy or world size; and the resume
  // state save_state() gave. Collective.
  virtual void load_state(const optim::NamedState& optimizer, const checkpoint::NamedTensors& resume) = 0;
};

// How the optimizer's parameter groups are formed from optim.* (weight decay, norm_lr_scale).
optim::GroupRule group_rule(const OptimConfig& cfg);

// Note [What the strategy decides for the loop]
// Strategies differ outside the step too: in how the data is shared and paced, and in how a run stops on
// a signal. The factory decides those from the config (strategy_traits in train/StrategyFactory.h), before
// the world or the model exist, and the loop in train/ reads them as data: it branches on no strategy.
struct StrategyTraits {
  // This process's share of the training set: part `data_part` of `data_parts`, shuffled under
  // `data_seed` (ddp's ranks: their rank of the world, under train.seed).
  int data_parts = 1, data_part = 0;
  uint64_t data_seed = 0;
  // > 0: a step is this many samples from every process together, however they split them, drawn pass
  // after pass without epochs (the swarm's random sampler); 0: a step is a batch of every rank.
  int64_t endless_step_samples = 0;
  // Ctrl-C or SIGTERM makes this process leave alone between steps (Note [Leaving a swarm] in
  // train/Trainer.cpp); otherwise every rank stops after the step they agree on.
  bool leaves_alone = false;
  // Its processes are runs of their own that trackers group under one tag (the swarm's peers).
  bool groups_runs = false;
  // One collective in flight at a time (ddp stepping inside backward: Note [The optimizer inside backward]).
  bool one_collective_at_a_time = false;
};

}  // namespace cohort::parallel

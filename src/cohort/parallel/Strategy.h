// The one interface the training loop talks to for data parallelism. DDP implements it now; ZeRO and
// FSDP implement it later, so the loop in train/Trainer.cpp reads the same for every strategy.
//
//   auto strategy = cohort::make_strategy(cfg, model, world.comm);
//   { auto sync = strategy->gradient_sync(last_micro_batch); loss.backward(); }
//   optimizer.step(lr);
#pragma once

#include <memory>
#include <string>

#include <torch/nn/module.h>

#include "cohort/comm/Communicator.h"
#include "cohort/config/Config.h"
#include "cohort/parallel/ddp/CommHook.h"

namespace cohort {

// Bytes this rank put into gradient collectives in the last synchronized backward, and what an
// uncompressed all-reduce of the same gradients would have sent.
struct SyncBytes {
  int64_t wire = 0;
  int64_t dense = 0;
};

class Strategy {
 public:
  virtual ~Strategy() = default;
  virtual std::string name() const = 0;
  // Gradients produced while the returned guard lives are synchronized across ranks only if `enabled`
  // (gradient accumulation disables it on all but the last micro-batch).
  virtual std::shared_ptr<void> gradient_sync(bool enabled) = 0;
  virtual SyncBytes last_sync_bytes() const = 0;
  // State beyond the model and optimizer that an exact resume needs (a compression hook's residuals).
  // Collective: every rank calls it at the same point.
  virtual HookState state_dict() = 0;
  virtual void load_state_dict(const HookState& state) = 0;
};

// The gradient communication hook dist.compress names (none: plain averaging all-reduce).
std::shared_ptr<CommHook> make_comm_hook(const TrainConfig& cfg);

std::unique_ptr<Strategy> make_strategy(const TrainConfig& cfg, std::shared_ptr<torch::nn::Module> model,
                                        CommunicatorPtr comm);

}  // namespace cohort

// The one interface the training loop talks to for data parallelism. DDP implements it now; ZeRO and
// FSDP implement it later, so the loop in train/Trainer.cpp reads the same for every strategy.
//
//   auto strategy = cohort::make_strategy(cfg.dist, model, world.comm);
//   { auto sync = strategy->gradient_sync(last_micro_batch); loss.backward(); }
//   optimizer.step(lr);
#pragma once

#include <memory>
#include <string>

#include <torch/nn/module.h>

#include "cohort/comm/Communicator.h"
#include "cohort/config/Config.h"

namespace cohort {

class Strategy {
 public:
  virtual ~Strategy() = default;
  virtual std::string name() const = 0;
  // Gradients produced while the returned guard lives are synchronized across ranks only if `enabled`
  // (gradient accumulation disables it on all but the last micro-batch).
  virtual std::shared_ptr<void> gradient_sync(bool enabled) = 0;
  // Bytes this rank sent into collectives in the last synchronized backward.
  virtual int64_t last_sync_bytes() const = 0;
};

std::unique_ptr<Strategy> make_strategy(const DistConfig& cfg, std::shared_ptr<torch::nn::Module> model,
                                        CommunicatorPtr comm);

}  // namespace cohort

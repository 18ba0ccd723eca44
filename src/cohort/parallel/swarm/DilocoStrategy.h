// dist.strategy=diloco (arXiv 2311.08105): each peer takes diloco.inner_steps local steps with the
// configured optimizer, then the peers average the pseudo-gradient (the weights at the last outer step
// minus the weights now) through the swarm (p2p/Averager.h), optionally in fp16 or in int8 with
// per-block scales and error feedback (INTELLECT-1), and every peer applies the same outer Nesterov SGD
// step (diloco.outer_lr, diloco.outer_momentum). Communication is one round per inner_steps steps.
//
//   // train::make_strategy does this:
//   auto strategy = cohort::parallel::swarm::make_diloco_strategy(cfg, model, comm, std::move(ddp));
//   strategy->step(lr, {.step = s});   // an inner step; every inner_steps-th call also does the outer step
//
// The outer weights, the outer momentum and the error-feedback residual are checkpointed with the rest
// (StrategyState::resume), so a resumed peer continues the same outer optimizer.
#pragma once

#include <memory>

#include <torch/nn/module.h>

#include "cohort/comm/Communicator.h"
#include "cohort/config/Config.h"
#include "cohort/parallel/Strategy.h"
#include "cohort/util/OldNames.h"  // the names of the last release, for programs outside this tree

namespace cohort::parallel::swarm {

std::unique_ptr<Strategy> make_diloco_strategy(const TrainConfig& cfg, std::shared_ptr<torch::nn::Module> model,
                                               comm::CommunicatorPtr comm, std::unique_ptr<Strategy> inner);

}  // namespace cohort::parallel::swarm

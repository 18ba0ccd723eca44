// The one place that turns dist.strategy into a Strategy: the factory above every strategy folder (ddp/,
// shard/, swarm/), so that none of them includes another, and the loop's view of each strategy as data
// (StrategyTraits: Note [What the strategy decides for the loop] in parallel/Strategy.h).
//
//   auto strategy = cohort::train::make_strategy(cfg, model, world.comm);
//   const auto traits = cohort::train::strategy_traits(cfg, info.rank, info.world_size);
#pragma once

#include <memory>

#include <torch/nn/module.h>

#include "cohort/config/Config.h"
#include "cohort/parallel/Strategy.h"
#include "cohort/parallel/ddp/CommHook.h"

namespace cohort::train {

// The gradient communication hook dist.compress names (none: plain averaging all-reduce).
std::shared_ptr<parallel::ddp::CommHook> make_comm_hook(const TrainConfig& cfg);

// Wrapping checks that every rank built the same model and makes rank 0's weights everyone's.
std::unique_ptr<parallel::Strategy> make_strategy(const TrainConfig& cfg, std::shared_ptr<torch::nn::Module> model,
                                                  comm::CommunicatorPtr comm);

parallel::StrategyTraits strategy_traits(const TrainConfig& cfg, int rank, int world_size);

}  // namespace cohort::train

// ddp as a Strategy: full replicas, gradients all-reduced in buckets during backward (DistributedDataParallel)
// through a communication hook, the optimizer over fp32 masters, and optionally stepped inside backward
// (Note [The optimizer inside backward] in DdpStrategy.cpp). The factory (train/StrategyFactory.h) builds
// its options and hook from the config; the swarm and DiLoCo wrap one as their peer's inner job.
//
//   namespace ddp = cohort::parallel::ddp;
//   auto hook = std::make_shared<ddp::AllReduceHook>();
//   auto strategy = ddp::make_ddp_strategy(model, world.comm, ddp::DdpOptions{}, hook);
//   strategy->build_optimizer(cfg.optim);
#pragma once

#include <memory>

#include "cohort/parallel/Strategy.h"
#include "cohort/parallel/ddp/CommHook.h"
#include "cohort/parallel/ddp/DistributedDataParallel.h"
#include "cohort/util/OldNames.h"  // the names of the last release, for programs outside this tree

namespace cohort::parallel::ddp {

// Wrapping checks that every rank built the same model and makes rank 0's weights everyone's.
std::unique_ptr<Strategy> make_ddp_strategy(std::shared_ptr<torch::nn::Module> model, comm::CommunicatorPtr comm,
                                            const DdpOptions& options, std::shared_ptr<CommHook> hook);

}  // namespace cohort::parallel::ddp

// dist.strategy=swarm: Hivemind's Optimizer semantics between peers that join and leave, with no master.
// A peer (one launcher: its workers run ddp between them) trains on its own batches and counts samples;
// when the peers together have accumulated swarm.target_batch_size samples, the ready peers average
// their gradients weighted by samples (p2p/Averager.h) and all take the same optimizer step. Without
// failures that is synchronous training at that global batch, so train.epochs and train.max_steps count
// these global steps as they count ddp's.
//
//   // train::make_strategy does this:
//   auto strategy = cohort::parallel::swarm::make_swarm_strategy(cfg, model, comm, std::move(ddp));
//   { auto sync = strategy->gradient_sync(true); loss.backward(); }
//   auto r = strategy->step(lr, {});   // r.applied: false while the swarm is still accumulating
//
// Only the peer's first worker (local rank 0) talks to the swarm; it hands its decisions and the
// averaged gradient to the peer's other workers by broadcast.
#pragma once

#include <memory>

#include <torch/nn/module.h>

#include "cohort/comm/Communicator.h"
#include "cohort/config/Config.h"
#include "cohort/parallel/Strategy.h"
#include "cohort/util/OldNames.h"  // the names of the last release, for programs outside this tree

namespace cohort::parallel::swarm {

std::unique_ptr<Strategy> make_swarm_strategy(const TrainConfig& cfg, std::shared_ptr<torch::nn::Module> model,
                                              comm::CommunicatorPtr comm, std::unique_ptr<Strategy> inner);

}  // namespace cohort::parallel::swarm

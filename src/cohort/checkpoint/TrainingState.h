// The tensors of a training-state file (<tag>.train.safetensors) have three owners: the optimizer's
// per-parameter state under its own names, a strategy's resume state (PowerSGD's residuals and Q) under
// "strategy.", and airbench's lookahead average under "lookahead.". This is where those prefixes are
// split (the prefixes themselves are in checkpoint/Names.h); the trainer joins the parts before a save and
// splits them after a load.
//
//   auto saved = cohort::checkpoint::join_training_state(opt_state, strategy_state, lookahead_state);
//   auto parts = cohort::checkpoint::split_training_state(ck.optimizer);   // parts.strategy, ...
#pragma once

#include <string>

#include "cohort/checkpoint/Checkpoint.h"
#include "cohort/checkpoint/Names.h"

namespace cohort::checkpoint {

struct TrainingStateParts {
  NamedTensors optimizer, strategy, lookahead;
};

NamedTensors join_training_state(const TrainingStateParts& parts);
TrainingStateParts split_training_state(const NamedTensors& saved);

}  // namespace cohort::checkpoint

#include "cohort/checkpoint/TrainingState.h"

namespace cohort::checkpoint {

NamedTensors join_training_state(const TrainingStateParts& parts) {
  NamedTensors all = parts.optimizer;
  for (const auto& [name, t] : parts.strategy) all.emplace_back(kStrategyPrefix + name, t);
  for (const auto& [name, t] : parts.lookahead) all.emplace_back(kLookaheadPrefix + name, t);
  return all;
}

TrainingStateParts split_training_state(const NamedTensors& saved) {
  TrainingStateParts parts;
  for (const auto& [name, t] : saved) {
    if (name.rfind(kStrategyPrefix, 0) == 0)
      parts.strategy.emplace_back(name.substr(kStrategyPrefix.size()), t);
    else if (name.rfind(kLookaheadPrefix, 0) == 0)
      parts.lookahead.emplace_back(name.substr(kLookaheadPrefix.size()), t);
    else
      parts.optimizer.emplace_back(name, t);
  }
  return parts;
}

}  // namespace cohort::checkpoint

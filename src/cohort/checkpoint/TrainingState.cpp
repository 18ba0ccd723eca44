#include "cohort/checkpoint/TrainingState.h"

namespace cohort::checkpoint {

NamedTensors join_training_state(const TrainingStateParts& parts) {
  NamedTensors all = parts.optimizer;
  for (const auto& [name, t] : parts.strategy) all.emplace_back(names::kStrategyPrefix + name, t);
  for (const auto& [name, t] : parts.lookahead) all.emplace_back(names::kLookaheadPrefix + name, t);
  return all;
}

TrainingStateParts split_training_state(const NamedTensors& saved) {
  TrainingStateParts parts;
  for (const auto& [name, t] : saved) {
    if (name.rfind(names::kStrategyPrefix, 0) == 0)
      parts.strategy.emplace_back(name.substr(names::kStrategyPrefix.size()), t);
    else if (name.rfind(names::kLookaheadPrefix, 0) == 0)
      parts.lookahead.emplace_back(name.substr(names::kLookaheadPrefix.size()), t);
    else
      parts.optimizer.emplace_back(name, t);
  }
  return parts;
}

}  // namespace cohort::checkpoint

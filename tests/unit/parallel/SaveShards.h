// What the trainer does to save a sharded strategy at the end of a test run: every rank's shard_state()
// through checkpoint::save_sharded as tag "last", with a training state naming the step and world size.
#pragma once

#include <filesystem>

#include "cohort/checkpoint/Sharded.h"
#include "cohort/parallel/Strategy.h"

namespace cohort::testing {

inline void save_shards(Strategy& strategy, int64_t step, int world, const std::filesystem::path& dir,
                        Communicator& comm) {
  auto st = strategy.shard_state();
  checkpoint::TrainState ts;
  ts.step = step;
  ts.world_size = world;
  ts.config_json = "{}";
  checkpoint::save_sharded(dir, "last", st.tensors, st.layout, ts, comm);
}

}  // namespace cohort::testing

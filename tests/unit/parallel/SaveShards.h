// What the trainer does to save a sharded strategy at the end of a test run: every rank's save_state()
// shards through checkpoint::save_sharded as tag "last" (with its own commit marker, as outside a step
// directory), with a training state naming the step and world size.
#pragma once

#include <filesystem>

#include "cohort/checkpoint/ShardedCheckpoint.h"
#include "cohort/parallel/Strategy.h"

namespace cohort::testing {

inline void save_shards(parallel::Strategy& strategy, int64_t step, int world, const std::filesystem::path& dir,
                        comm::Communicator& comm) {
  auto st = strategy.save_state();
  checkpoint::TrainState ts;
  ts.step = step;
  ts.world_size = world;
  ts.config_json = "{}";
  checkpoint::save_sharded(dir, "last", *st.shards, ts, comm, checkpoint::CommitBy::kMarkerFile);
}

}  // namespace cohort::testing

// What every rank must agree on before and while training: through the rendezvous store, the config
// (Note [Every rank trains the same config]), the run directory, and any choice rank 0 makes from what it
// sees on disk; through a collective, the step to stop after on a signal.
//
//   check_same_config(config::to_json(cfg), world);           // every rank stops, naming the keys
//   const fs::path run_dir = agree_run_dir(cfg, world);
//   auto dir = decided_by_rank0(world, "cohort/some_choice", [&] { return pick(); });
//   if (agreed_stop_signal(world, util::stop_signal(), step, false, device) != 0) break;
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>

#include <c10/core/Device.h>
#include <nlohmann/json.hpp>

#include "cohort/comm/Rendezvous.h"
#include "cohort/config/Config.h"

namespace cohort::train {

// Rank 0 runs `decide` and every rank returns its result; a single process just runs it. On a network
// file system another node's view of a directory may lag, so choices made from the disk (the save to
// resume from, a sharded save's directory) are made once. If `decide` throws on rank 0, the others
// throw too, quoting it, instead of waiting for the store's timeout. `key` must be unique per decision.
std::string decided_by_rank0(comm::World& world, const std::string& key, const std::function<std::string()>& decide);

// Throws ConfigError on every rank, naming the differing keys and values, when any rank's config differs
// from rank 0's in a key that is not machine-local.
void check_same_config(const nlohmann::json& mine, comm::World& world);

// The stop signal every rank acts on after `step`, from each rank's own (`mine`, 0 for none). A process
// that `leaves_alone` (a swarm peer: StrategyTraits) has its first worker decide for all its workers, every
// step. Elsewhere a scheduler's warning (SIGUSR1)
// may reach the ranks at different steps, or only some of them: the largest signal number any rank holds
// decides, every kStopCheckSteps steps (0 in between), so that every rank stops after the same step and
// the save that follows is whole. `device` is where the training runs (NCCL reduces device tensors only).
inline constexpr int64_t kStopCheckSteps = 10;
int agreed_stop_signal(comm::World& world, int mine, int64_t step, bool leaves_alone, c10::Device device);

// The run directory rank 0 picks (run.dir, or runs/<timestamp>) and creates, as an absolute path.
std::filesystem::path agree_run_dir(const TrainConfig& cfg, comm::World& world);

}  // namespace cohort::train

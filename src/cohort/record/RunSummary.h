// The end of a training run: every rank's peak memory, CPU and GPU use, model-state bytes and skipped
// bad files gathered to rank 0, which writes the model_state record, summary.json (the figures every
// tool reads: accuracy, time, throughput, bytes per step, the resolved config) and the closing line.
//
//   RunFacts facts{info, cfg, config_json, strategy, comm, precision, chosen, nhwc, device, run_dir};
//   facts.steps = step; ...
//   cohort::record::write_run_summary(facts, clock, monitor, log);   // collective: every rank calls it
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>

#include <nlohmann/json.hpp>

#include "cohort/amp/MixedPrecision.h"
#include "cohort/comm/Communicator.h"
#include "cohort/comm/WorldInfo.h"
#include "cohort/config/Config.h"
#include "cohort/log/Peak.h"
#include "cohort/log/ResourceMonitor.h"
#include "cohort/parallel/Strategy.h"
#include "cohort/record/PhaseClock.h"
#include "cohort/record/RunLog.h"

namespace cohort::record {

// What the run did, as the trainer knows it at the end.
struct RunFacts {
  const comm::WorldInfo& info;
  const TrainConfig& cfg;
  const nlohmann::json& config_json;
  parallel::Strategy& strategy;
  comm::Communicator& comm;
  const amp::MixedPrecision& precision;
  nlohmann::json chosen;  // what `auto` picked (train/AutoSettings.h's to_json)
  bool channels_last;
  c10::Device device;
  std::filesystem::path run_dir;
  int64_t steps = 0, steps_per_epoch = 1, global_batch = 0, images_seen = 0;
  double train_seconds = 0, test_accuracy = -1, best = -1;
  parallel::StateBytes state_bytes;
  int64_t bad_files = 0;        // this rank's skipped files, training and test
  int stop_signal = 0;          // the run left early on this signal (Note [Leaving a swarm]); 0: it ran to its end
  double flops_per_image = -1;  // one training image's forward and backward (models/Flops.h); -1: not counted
  // One worker's peak as the training windows divided by it (log/Peak.h), and why there is none.
  std::optional<log::Peak> peak;
  std::string peak_why;
};

void write_run_summary(const RunFacts& facts, const PhaseClock& clock, log::ResourceMonitor& monitor, RunLog& log);

}  // namespace cohort::record

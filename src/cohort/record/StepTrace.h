// A Chrome trace of a few training steps, per rank: with log.trace_steps=A:B each rank writes
// RUN_DIR/trace/rank<R>.json in the Trace Event Format (the JSON that Perfetto and chrome://tracing
// open): the steps, the phases (data, forward, backward, optimizer, eval, checkpoint, as the training
// loop's PhaseClock switches them) and the collectives of those steps, with their purpose ("gradient
// bucket 0"), size and state, from the rank's flight recorder; a swarm peer's rounds too. `cohort report
// RUN_DIR` merges the ranks' files into RUN_DIR/trace.json, one process per rank on one clock.
//
//   cohort::record::StepTrace trace({20, 22}, run_dir, rank, world.comm->flight());
//   clock.trace_into(&trace);      // the phases
//   trace.step_began(21);  ...  trace.step_ended(21);   // after step 22 the file is written
//   const auto merged = cohort::record::merge_step_traces(run_dir);   // {"traceEvents": [...]}
//
// Only steps A to B cost anything: outside them each hook is one comparison (and PhaseClock calls none
// without log.trace_steps). Times are wall-clock
// microseconds (the flight recorder's clock), so ranks on one machine line up exactly and ranks on
// several machines as well as their clocks agree.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace cohort::comm {
class FlightRecorder;
}

namespace cohort::record {

// The trace's format, in its "otherData": {"format": kStepTraceFormat, "version": kStepTraceVersion,
// "origin_unix_us": ...}. Version 2: "ts" and "dur" in whole microseconds from that origin (Note [Trace
// times are small integers] in the .cpp); version 1 (absolute, fractional) is still merged.
inline constexpr const char* kStepTraceFormat = "cohort-step-trace";
inline constexpr int kStepTraceVersion = 2;

class StepTrace {
 public:
  // `steps`: {A, B}, 1-based and inclusive ({0, 0}: off). `flight` may be null (no collectives then).
  StepTrace(std::pair<int64_t, int64_t> steps, std::filesystem::path run_dir, int rank,
            std::shared_ptr<comm::FlightRecorder> flight);

  // The step about to be trained (1-based); a swarm step that only accumulates calls it again.
  void step_began(int64_t step);
  // The training loop's phase from now on (PhaseClock::switch_to).
  void phase(const char* name);
  // `step` ended; after the last one the trace is written (and nothing more is recorded).
  void step_ended(int64_t step);
  // The run ends: a window not yet closed (train.max_steps, a signal) is written as far as it went.
  void finish();

  // Where the trace was written; empty before.
  const std::filesystem::path& written() const { return written_; }

 private:
  struct Span {
    std::string name;
    double begin_us = 0, end_us = 0;
  };
  void close();  // ends the window and writes it
  void write(double end_us);

  int64_t first_, last_;
  std::filesystem::path run_dir_;
  int rank_;
  std::shared_ptr<comm::FlightRecorder> flight_;
  bool recording_ = false, done_ = false;
  double window_begin_us_ = 0;
  int64_t origin_us_ = 0;  // the whole second the window began in
  std::vector<Span> steps_, phases_;
  std::vector<int64_t> traced_;  // the steps of steps_
  Span open_phase_;
  std::filesystem::path written_;
};

// RUN_DIR/trace/rank*.json merged into one trace, one process per rank ({"traceEvents": [...], ...});
// null when the run dir holds none. Throws cohort::Error naming a file that is not a step trace.
nlohmann::json merge_step_traces(const std::filesystem::path& run_dir);

}  // namespace cohort::record

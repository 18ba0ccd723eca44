// Where a worker's time went: the training loop switches this clock from phase to phase (data, forward,
// backward, optimizer, evaluation, checkpointing), and time spent blocked on collectives during forward,
// backward and the optimizer step is moved to "comm": gradient (or, under fsdp, parameter) communication
// that computation did not hide. Each switch reads a steady clock and one atomic counter, so it costs well
// under a microsecond.
//
//   cohort::record::PhaseClock clock;
//   clock.switch_to(Phase::kData);     auto b = loader.next();
//   clock.switch_to(Phase::kForward);  auto loss = ...;
//   { PhaseClock::Scope s(clock, Phase::kEval); evaluate(...); }   // back to the phase before on exit
//   clock.stop();
//   std::cout << clock.line();         // "data 2%, forward 31%, backward 40%, comm 6%, ..."
//
// On CUDA the clock reads host time: kernels run asynchronously, so GPU work lands in whichever phase
// next waits for the device (the loss's .item() after backward, for example).
#pragma once

#include <array>
#include <chrono>
#include <string>

#include <nlohmann/json.hpp>

namespace cohort::comm {
class Communicator;
}

namespace cohort::record {

class StepTrace;

enum class Phase { kData, kForward, kBackward, kComm, kOptimizer, kEval, kCheckpoint, kOther };
constexpr int kPhaseCount = 8;
const char* phase_name(Phase p);

class PhaseClock {
 public:
  using Clock = std::chrono::steady_clock;

  // Starts in kOther; the time until the first switch is the run's setup before the loop.
  PhaseClock();
  // Ends the current phase and starts `next`.
  void switch_to(Phase next);
  // Ends the current phase; nothing counts until the next switch_to.
  void stop();
  Phase current() const { return current_; }
  // Tells `trace` of every switch from now on (log.trace_steps: record/StepTrace.h); null: nobody.
  void trace_into(StepTrace* trace) { trace_ = trace; }

  double seconds(Phase p) const { return seconds_[static_cast<int>(p)]; }
  double total_seconds() const;

  // {"wall_seconds": T, "seconds": {"data": s, ...}, "share": {"data": s / T, ...}}
  nlohmann::json to_json() const;
  // "data 2%, forward 31%, ..." in phase order, phases under 0.5% left out.
  std::string line() const;

  // Switches to `phase` for its lifetime, then back to the phase that was running.
  class Scope {
   public:
    Scope(PhaseClock& clock, Phase phase) : clock_(clock), before_(clock.current()) { clock_.switch_to(phase); }
    ~Scope() { clock_.switch_to(before_); }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    PhaseClock& clock_;
    Phase before_;
  };

 private:
  std::array<double, kPhaseCount> seconds_{};
  Phase current_ = Phase::kOther;
  bool running_ = true;
  Clock::time_point since_;
  double waited_at_start_ = 0;  // comm::collective_wait_seconds() when the current phase began
  StepTrace* trace_ = nullptr;
};

// Per-rank phase seconds in the order of Phase, for gathering across ranks.
std::array<double, kPhaseCount> phase_seconds(const PhaseClock& clock);
// The same JSON as PhaseClock::to_json, from gathered seconds.
nlohmann::json phases_json(const std::array<double, kPhaseCount>& seconds);
// Collective: this rank's phases_json with "per_rank", every rank's seconds (summary.json's time_breakdown).
nlohmann::json gather_time_breakdown(const PhaseClock& clock, comm::Communicator& comm);

}  // namespace cohort::record

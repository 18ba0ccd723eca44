#include "cohort/record/PhaseClock.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "cohort/comm/Communicator.h"
#include "cohort/comm/FlightRecorder.h"
#include "cohort/record/StepTrace.h"

namespace cohort::record {
namespace {

// Collective waits inside these phases are communication the step waited for, not compute.
bool waits_are_comm(Phase p) { return p == Phase::kForward || p == Phase::kBackward || p == Phase::kOptimizer; }

}  // namespace

const char* phase_name(Phase p) {
  switch (p) {
    case Phase::kData: return "data";
    case Phase::kForward: return "forward";
    case Phase::kBackward: return "backward";
    case Phase::kComm: return "comm";
    case Phase::kOptimizer: return "optimizer";
    case Phase::kEval: return "eval";
    case Phase::kCheckpoint: return "checkpoint";
    case Phase::kOther: return "other";
  }
  return "?";
}

PhaseClock::PhaseClock() : since_(Clock::now()), waited_at_start_(comm::collective_wait_seconds()) {}

void PhaseClock::switch_to(Phase next) {
  comm::set_current_phase(phase_name(next));  // what a flight record says the rank was doing
  if (trace_) trace_->phase(phase_name(next));
  const auto now = Clock::now();
  const double waited = comm::collective_wait_seconds();
  if (running_) {
    const double elapsed = std::chrono::duration<double>(now - since_).count();
    // A wait can straddle a phase boundary by the few nanoseconds between the two reads: clamp.
    const double comm = waits_are_comm(current_) ? std::clamp(waited - waited_at_start_, 0.0, elapsed) : 0.0;
    seconds_[static_cast<int>(current_)] += elapsed - comm;
    seconds_[static_cast<int>(Phase::kComm)] += comm;
  }
  current_ = next;
  running_ = true;
  since_ = now;
  waited_at_start_ = waited;
}

void PhaseClock::stop() {
  switch_to(current_);
  running_ = false;
}

double PhaseClock::total_seconds() const { return std::accumulate(seconds_.begin(), seconds_.end(), 0.0); }

std::array<double, kPhaseCount> phase_seconds(const PhaseClock& clock) {
  std::array<double, kPhaseCount> out{};
  for (int i = 0; i < kPhaseCount; ++i) out[i] = clock.seconds(static_cast<Phase>(i));
  return out;
}

nlohmann::json phases_json(const std::array<double, kPhaseCount>& seconds) {
  const double total = std::accumulate(seconds.begin(), seconds.end(), 0.0);
  nlohmann::json secs = nlohmann::json::object(), share = nlohmann::json::object();
  for (int i = 0; i < kPhaseCount; ++i) {
    const char* name = phase_name(static_cast<Phase>(i));
    secs[name] = seconds[i];
    share[name] = total > 0 ? seconds[i] / total : 0.0;
  }
  return {{"wall_seconds", total}, {"seconds", secs}, {"share", share}};
}

nlohmann::json gather_time_breakdown(const PhaseClock& clock, comm::Communicator& comm) {
  const auto mine = phase_seconds(clock);
  auto all = at::zeros({comm.size() * kPhaseCount}, at::kDouble);
  comm.all_gather(all, at::tensor(std::vector<double>(mine.begin(), mine.end()), at::kDouble), "phase times")->wait();
  auto out = phases_json(mine);
  out["per_rank"] = nlohmann::json::array();
  for (int r = 0; r < comm.size(); ++r) {
    std::array<double, kPhaseCount> theirs{};
    std::copy_n(all.data_ptr<double>() + r * kPhaseCount, kPhaseCount, theirs.begin());
    out["per_rank"].push_back(phases_json(theirs)["seconds"]);
  }
  return out;
}

nlohmann::json PhaseClock::to_json() const { return phases_json(phase_seconds(*this)); }

std::string PhaseClock::line() const {
  const double total = total_seconds();
  std::string out;
  for (int i = 0; i < kPhaseCount; ++i) {
    const double share = total > 0 ? seconds_[i] / total : 0.0;
    if (share < 0.005) continue;
    out += (out.empty() ? "" : ", ") + std::string(phase_name(static_cast<Phase>(i))) + " " +
           std::to_string(static_cast<int>(std::lround(100 * share))) + "%";
  }
  return out;
}

}  // namespace cohort::record

// The phase clock of the training loop (record/PhaseClock.h): every second lands in exactly one phase,
// collective waits inside forward, backward and the optimizer step move to "comm" while those inside
// evaluation stay there, and scopes return to the phase they interrupted. The sleeps only give lower
// bounds (a sleep never ends early); nothing here asserts how fast anything runs.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "cohort/comm/Communicator.h"
#include "cohort/log/Svg.h"
#include "cohort/record/PhaseClock.h"
#include "cohort/record/StepTrace.h"

namespace cohort {
namespace {

using record::Phase;
using record::PhaseClock;

void blocked_on_a_collective(std::chrono::milliseconds ms) {
  const comm::CollectiveWaitTimer blocked;
  std::this_thread::sleep_for(ms);
}

TEST(PhaseClock, CollectiveWaitsInAStepBecomeCommAndPhasesAddUp) {
  PhaseClock clock;
  clock.switch_to(Phase::kData);
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  clock.switch_to(Phase::kBackward);
  blocked_on_a_collective(std::chrono::milliseconds(30));
  clock.switch_to(Phase::kOptimizer);
  blocked_on_a_collective(std::chrono::milliseconds(20));
  clock.switch_to(Phase::kOther);
  clock.stop();

  EXPECT_GE(clock.seconds(Phase::kData), 0.010);
  EXPECT_GE(clock.seconds(Phase::kComm), 0.050);
  // What moved to comm left backward and the optimizer: only the few instructions around the waits stay.
  EXPECT_LT(clock.seconds(Phase::kBackward), clock.seconds(Phase::kComm));
  EXPECT_LT(clock.seconds(Phase::kOptimizer), clock.seconds(Phase::kComm));
  const auto j = clock.to_json();
  double shares = 0;
  for (const auto& [name, share] : j["share"].items()) shares += share.get<double>();
  EXPECT_NEAR(shares, 1.0, 1e-9);
  EXPECT_DOUBLE_EQ(j["wall_seconds"].get<double>(), clock.total_seconds());
  EXPECT_EQ(j["seconds"].size(), static_cast<size_t>(record::kPhaseCount));
  EXPECT_NE(clock.line().find("comm "), std::string::npos) << clock.line();
}

TEST(PhaseClock, ScopesReturnToTheInterruptedPhaseAndEvalKeepsItsWaits) {
  PhaseClock clock;
  clock.switch_to(Phase::kOther);
  {
    const PhaseClock::Scope eval(clock, Phase::kEval);
    EXPECT_EQ(clock.current(), Phase::kEval);
    blocked_on_a_collective(std::chrono::milliseconds(20));  // evaluation's metric all-reduce
    {
      const PhaseClock::Scope save(clock, Phase::kCheckpoint);  // a new best model is saved from eval
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_EQ(clock.current(), Phase::kEval);
  }
  EXPECT_EQ(clock.current(), Phase::kOther);
  clock.stop();
  EXPECT_GE(clock.seconds(Phase::kEval), 0.020);
  EXPECT_GE(clock.seconds(Phase::kCheckpoint), 0.010);
  EXPECT_EQ(clock.seconds(Phase::kComm), 0.0);
  // Stopped: time no longer counts.
  const double total = clock.total_seconds();
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(clock.total_seconds(), total);
}

TEST(PhaseClock, PhasesJsonFromGatheredSeconds) {
  std::array<double, record::kPhaseCount> s{};
  s[static_cast<int>(Phase::kForward)] = 3;
  s[static_cast<int>(Phase::kBackward)] = 1;
  const auto j = record::phases_json(s);
  EXPECT_DOUBLE_EQ(j["wall_seconds"].get<double>(), 4.0);
  EXPECT_DOUBLE_EQ(j["share"]["forward"].get<double>(), 0.75);
  EXPECT_DOUBLE_EQ(j["share"]["data"].get<double>(), 0.0);
}

TEST(StackedBarsSvg, OneBarPerRunWithASegmentPerPhase) {
  log::StackedBars p{"time", {"data", "forward", "backward"}, {{"run-a", {1, 2, 1}}, {"run-b", {0, 1, 0}}}};
  const auto svg = log::render_svg(p);
  EXPECT_NE(svg.find("<svg"), std::string::npos);
  EXPECT_NE(svg.find("run-a"), std::string::npos);
  EXPECT_NE(svg.find("forward 50%"), std::string::npos) << svg;   // run-a's forward: 2 of 4
  EXPECT_NE(svg.find("forward 100%"), std::string::npos) << svg;  // run-b is all forward
  EXPECT_EQ(svg.find("nan"), std::string::npos);
}

// Note [Trace times are small integers]: `cohort report` moves ranks whose windows began in different
// seconds to the earliest origin, in whole microseconds; a version 1 file (absolute, fractional times)
// is merged into the same form.
TEST(StepTrace, TheMergeAlignsRanksOnTheEarliestOriginInWholeMicroseconds) {
  const auto dir = std::filesystem::temp_directory_path() / "cohort-step-trace-merge";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir / "trace");
  auto rank_file = [&](int rank, int version, nlohmann::json origin, nlohmann::json ts) {
    nlohmann::json other = {
        {"format", record::kStepTraceFormat}, {"version", version}, {"rank", rank}, {"steps", {3, 5}}};
    if (!origin.is_null()) other["origin_unix_us"] = origin;
    const nlohmann::json trace = {
        {"traceEvents",
         {{{"name", "step 3"}, {"ph", "X"}, {"ts", ts}, {"dur", 250}, {"pid", rank}, {"tid", rank * 1000}}}},
        {"otherData", other}};
    std::ofstream(dir / "trace" / ("rank" + std::to_string(rank) + ".json")) << trace.dump();
  };
  rank_file(0, 2, int64_t{1800000001000000}, 700);
  rank_file(1, 2, int64_t{1800000000000000}, 999500);
  auto merged = record::merge_step_traces(dir);
  EXPECT_EQ(merged["otherData"]["origin_unix_us"], int64_t{1800000000000000});
  EXPECT_EQ(merged["traceEvents"][0]["ts"], 1000700);  // rank 0, a second later
  EXPECT_EQ(merged["traceEvents"][1]["ts"], 999500);
  rank_file(0, 1, nullptr, 1800000000999999.75);
  rank_file(1, 1, nullptr, 1800000001000000.25);
  merged = record::merge_step_traces(dir);
  EXPECT_EQ(merged["otherData"]["origin_unix_us"], int64_t{1800000000000000});
  EXPECT_TRUE(merged["traceEvents"][0]["ts"].is_number_integer());
  EXPECT_EQ(merged["traceEvents"][0]["ts"], 1000000);
  EXPECT_EQ(merged["traceEvents"][1]["ts"], 1000000);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace cohort

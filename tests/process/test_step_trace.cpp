// log.trace_steps (record/StepTrace.h) on a real two-worker job: each rank writes its trace of the steps
// asked for, `cohort report` merges them, and the merged file holds what the Trace Event Format asks of
// every event, with each rank's steps, phases and gradient all-reduces in it, and times in whole
// microseconds (Note [Trace times are small integers]). A real reader, Perfetto's trace processor, loads
// such a file in Reference.StepTraceLoadsInPerfetto (label reference). About 8 s.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "process/Harness.h"

namespace fs = std::filesystem;
using namespace cohort::testing;

// Steps 23 to 25 hold the first epoch's end (24 steps of 2 x 32 of the 1,536 images): its evaluation and
// its checkpoint are in the window, between steps 24 and 25.
TEST(StepTrace, TwoRanksTraceStepsAcrossAnEpochsEndAndReportMergesThem) {
  const auto dir = fresh_dir("step-trace");
  const auto r =
      cohort_train(quick_args(dir, {"--nproc-per-node", "2", "train.max_steps=27", "log.trace_steps=23:25"}), 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_TRUE(fs::exists(dir / "trace" / "rank0.json"));
  ASSERT_TRUE(fs::exists(dir / "trace" / "rank1.json"));
  const auto report = run({COHORT_BINARY, "report", dir.string()}, 120.0);
  ASSERT_EQ(report.exit_code, 0) << report.output;
  EXPECT_NE(report.output.find("trace of steps 23 to 25 (2 rank(s)) written"), std::string::npos) << report.output;
  const auto trace = read_json(dir / "trace.json");
  ASSERT_TRUE(trace["traceEvents"].is_array());
  EXPECT_EQ(trace["displayTimeUnit"], "ms");

  // Per rank, the names of its complete events on each row.
  std::map<int, std::map<std::string, std::set<std::string>>> seen;
  std::map<int, std::pair<double, double>> steps_span;
  for (const auto& e : trace["traceEvents"]) {
    ASSERT_TRUE(e["name"].is_string()) << e.dump();
    ASSERT_TRUE(e["pid"].is_number_integer()) << e.dump();
    const auto ph = e["ph"].get<std::string>();
    ASSERT_TRUE(ph == "X" || ph == "M") << e.dump();
    if (ph == "M") {
      ASSERT_TRUE(e["args"].is_object()) << e.dump();
      continue;
    }
    ASSERT_TRUE(e["tid"].is_number_integer()) << e.dump();
    ASSERT_TRUE(e["ts"].is_number_integer()) << e.dump();
    ASSERT_TRUE(e["dur"].is_number_integer()) << e.dump();
    EXPECT_GE(e["dur"].get<double>(), 0.0) << e.dump();
    const int rank = e["pid"].get<int>();
    seen[rank][e["cat"].get<std::string>()].insert(e["name"].get<std::string>());
    if (e["cat"] == "step") {
      auto& [begin, end] = steps_span[rank];
      const double ts = e["ts"].get<double>(), te = ts + e["dur"].get<double>();
      begin = begin == 0 ? ts : std::min(begin, ts);
      end = std::max(end, te);
    }
  }
  // Complete events on one row (pid, tid) nest or follow each other, as the format requires: overlapping
  // collectives (ddp's buckets) take rows of their own.
  std::map<std::pair<int, int>, std::vector<std::pair<double, double>>> rows;
  for (const auto& e : trace["traceEvents"])
    if (e["ph"] == "X")
      rows[{e["pid"].get<int>(), e["tid"].get<int>()}].emplace_back(e["ts"].get<double>(),
                                                                    e["ts"].get<double>() + e["dur"].get<double>());
  for (auto& [row, spans] : rows) {
    std::sort(spans.begin(), spans.end());
    std::vector<double> open;  // the ends of the events that enclose the current one
    for (const auto& [begin, end] : spans) {
      while (!open.empty() && open.back() <= begin) open.pop_back();
      if (!open.empty()) {
        EXPECT_LE(end, open.back()) << "rank " << row.first << " row " << row.second << ": an event from " << begin
                                    << " to " << end << " overlaps one that ends at " << open.back();
      }
      open.push_back(end);
    }
  }
  ASSERT_EQ(seen.size(), 2u);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(seen[rank]["step"], (std::set<std::string>{"step 23", "step 24", "step 25"})) << "rank " << rank;
    for (const char* phase : {"data", "forward", "backward", "optimizer", "eval", "checkpoint"})
      EXPECT_TRUE(seen[rank]["phase"].count(phase)) << "rank " << rank << " has no '" << phase << "' phase";
    EXPECT_TRUE(seen[rank]["collective"].count("all_reduce 'gradient bucket 0'")) << "rank " << rank;
  }
  // One clock: the ranks' windows overlap (they run the same steps at once).
  EXPECT_LT(steps_span[0].first, steps_span[1].second);
  EXPECT_LT(steps_span[1].first, steps_span[0].second);
}

TEST(StepTrace, ARangeThatIsNotOneIsRefusedNamingTheKey) {
  const auto dir = fresh_dir("step-trace-bad");
  const auto r = cohort_train(quick_args(dir, {"log.trace_steps=5:3"}), 60);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("log.trace_steps=5:3 is not a range of steps A:B"), std::string::npos) << r.output;
}

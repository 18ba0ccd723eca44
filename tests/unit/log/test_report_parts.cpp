// The logbook's parts that need no run: SVG line plots and their tick choice, and the resource monitor's
// samples (this machine has no NVIDIA driver, so NVML must report itself absent, not fail).
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "cohort/log/Nvml.h"
#include "cohort/log/ResourceMonitor.h"
#include "cohort/log/Svg.h"

namespace fs = std::filesystem;
using namespace cohort::log;

namespace {
size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}
}  // namespace

TEST(Svg, NiceTicksAreRoundAndCoverTheRange) {
  EXPECT_EQ(nice_ticks(0, 1), (std::vector<double>{0, 0.2, 0.4, 0.6000000000000001, 0.8, 1}));
  const auto t = nice_ticks(0.37, 2.61);
  EXPECT_LE(t.front(), 0.37);
  EXPECT_GE(t.back(), 2.61);
  EXPECT_DOUBLE_EQ(t[1] - t[0], 0.5);
  const auto flat = nice_ticks(3, 3);  // one value: still a range to draw
  EXPECT_GE(flat.size(), 2u);
}

TEST(Svg, OnePolylinePerSeriesWithEscapedLegend) {
  LinePlot p{
      "Loss <train>", "epoch", "loss", {{"a & b", {{0, 2.0}, {1, 1.0}, {2, NAN}}}, {"test", {{0.5, 1.5}, {1.5, 0.9}}}}};
  const std::string svg = render_svg(p);
  EXPECT_EQ(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_EQ(count(svg, "<polyline"), 2u);
  EXPECT_EQ(count(svg, "<circle"), 4u);  // the NaN point is skipped
  EXPECT_NE(svg.find("a &amp; b"), std::string::npos);
  EXPECT_NE(svg.find("Loss &lt;train&gt;"), std::string::npos);
  EXPECT_EQ(svg.find("nan"), std::string::npos);
}

TEST(ResourceMonitor, NvmlIsAbsentWithAReasonWithoutADriver) {
  Nvml nvml;
  if (nvml.available()) {
    GTEST_SKIP() << "this machine has an NVIDIA driver; the absent case is not testable here";
  }
  EXPECT_EQ(nvml.device_count(), 0);
  EXPECT_FALSE(nvml.why_unavailable().empty());
  EXPECT_FALSE(nvml.sample(0).has_value());
}

TEST(ResourceMonitor, SamplesAtItsIntervalIntoTheFile) {
  const auto file = fs::temp_directory_path() / ("cohort-monitor-" + std::to_string(::getpid()) + ".jsonl");
  fs::remove(file);
  ResourceTotals totals;
  {
    ResourceMonitor mon(0.05, file, /*gpu_index=*/0);
    // Keep a core busy so CPU use is visibly above zero.
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(400);
    volatile double x = 0;
    while (std::chrono::steady_clock::now() < until) x = x + 1;
    const auto look = mon.sample_now(/*record=*/false);
    EXPECT_GT(look.rss, 1 << 20);
    EXPECT_GE(look.peak_rss, look.rss);
    mon.stop();  // no sample can land in the file after the totals are read
    totals = mon.totals();
  }
  std::ifstream in(file);
  std::string line;
  int lines = 0;
  double max_cpu = 0;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    EXPECT_GT(j["rss_bytes"].get<int64_t>(), 0);
    EXPECT_GT(j["elapsed_s"].get<double>(), 0);
    max_cpu = std::max(max_cpu, j["cpu_percent"].get<double>());
    ++lines;
  }
  // 400 ms at 50 ms: about 8 samples; a loaded machine may delay a few, never all.
  EXPECT_GE(lines, 4);
  EXPECT_LE(lines, 9);
  EXPECT_EQ(totals.samples, lines);
  EXPECT_GT(max_cpu, 50.0);  // the busy loop used most of a core
  EXPECT_GT(totals.peak_rss, 0);
  fs::remove(file);
}

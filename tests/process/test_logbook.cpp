// The run logbook from real runs: `cohort report` on a 1-worker and a 2-worker run (every section, the
// numbers equal to summary.json, the speedup), the trainer's TensorBoard scalars decoded by protoc, and
// `cohort find-batch-size` against a memory budget (the batch found fits, twice it does not).
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <tuple>

#include "process/Harness.h"

namespace fs = std::filesystem;
using namespace cohort::testing;
using nlohmann::json;

namespace {

// Every scalar tag in a TensorBoard event file, read by one protoc --decode_raw. The records go in as
// field 1 of one outer message (tag byte 0x0a, the length as a varint, the Event's bytes), which protoc
// prints nested, field by field as it would each record alone: one process, where one per record spent
// 16 of this test's 24 s starting protoc (2026-12-03).
std::string decoded_events(const fs::path& run_dir, const fs::path& scratch) {
  fs::path file;
  for (const auto& e : fs::directory_iterator(run_dir))
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0) file = e.path();
  EXPECT_FALSE(file.empty()) << "no event file in " << run_dir;
  const std::string all = read_file(file);
  std::string outer;
  for (size_t at = 0; at + 12 <= all.size();) {
    uint64_t len = 0;
    std::memcpy(&len, all.data() + at, 8);
    outer += '\x0a';
    uint64_t v = len;
    for (; v > 0x7f; v >>= 7) outer += static_cast<char>((v & 0x7f) | 0x80);
    outer += static_cast<char>(v);
    outer += all.substr(at + 12, len);
    at += 12 + len + 4;
  }
  std::ofstream(scratch, std::ios::binary) << outer;
  const auto r = run({"/bin/sh", "-c", "protoc --decode_raw < " + scratch.string()}, 30);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return r.output;
}

}  // namespace

TEST(Logbook, ReportOfTwoRealRunsMatchesTheirSummaries) {
  const auto one = fresh_dir("logbook-1w"), two = fresh_dir("logbook-2w"), out = fresh_dir("logbook-report");
  auto r = cohort_train(quick_args(one, {"--nproc-per-node", "1", "train.epochs=2", "log.monitor_s=0.2"}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = cohort_train(quick_args(two, {"--nproc-per-node", "2", "train.epochs=2", "log.monitor_s=0.2"}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_cohort({"report", one.string(), two.string(), "--out", out.string()}, 60);
  ASSERT_EQ(r.exit_code, 0) << r.output;

  const std::string md = read_file(out / "report.md");
  for (const char* section : {"## Comparison", "## Plots", "### Setup", "### Results", "### Validation per epoch",
                              "### Resources per rank", "### Largest batch", "### Config"})
    EXPECT_NE(md.find(section), std::string::npos) << section;
  for (const char* svg : {"loss_vs_epoch.svg", "loss_vs_time.svg", "accuracy_vs_epoch.svg", "accuracy_vs_time.svg"}) {
    EXPECT_NE(md.find(std::string("](") + svg + ")"), std::string::npos) << svg;
    const std::string s = read_file(out / svg);
    EXPECT_EQ(s.rfind("<svg", 0), 0u) << svg;
    EXPECT_EQ(std::count(s.begin(), s.end(), '\n') > 10, true);
    EXPECT_NE(s.find("<polyline"), std::string::npos) << svg;
  }

  const json report = read_json(out / "report.json");
  ASSERT_EQ(report["runs"].size(), 2u);
  const fs::path dirs[] = {one, two};
  for (int i = 0; i < 2; ++i) {
    const json summary = read_json(dirs[i] / "summary.json");
    const json& run = report["runs"][i];
    EXPECT_EQ(run["setup"]["world_size"], summary["world_size"]);
    EXPECT_EQ(run["setup"]["strategy"], summary["strategy"]);
    EXPECT_EQ(run["setup"]["global_batch"], summary["global_batch"]);
    EXPECT_EQ(run["results"]["best_test_accuracy"], summary["best_test_accuracy"]);
    EXPECT_EQ(run["results"]["train_seconds"], summary["train_seconds"]);
    EXPECT_EQ(run["results"]["images_per_second"], summary["images_per_second"]);
    EXPECT_EQ(run["resources"].size(), summary["world_size"].get<size_t>());
    EXPECT_EQ(run["resources"][0]["peak_rss_bytes"], summary["peak_rss_bytes"][0]);
    // One validation row per epoch, the last one the summary's final accuracy.
    ASSERT_EQ(run["epochs"].size(), 2u);
    EXPECT_EQ(run["epochs"][1]["test_top1"], summary["test_accuracy"]);
    // The markdown shows the same best accuracy, to two decimals.
    char best[32];
    std::snprintf(best, sizeof best, "| best test top-1 | %.2f%% |", 100 * summary["best_test_accuracy"].get<double>());
    EXPECT_NE(md.find(best), std::string::npos) << best;
    // MFU, from the summary, with the peak it divides by and where that came from.
    EXPECT_EQ(run["results"]["mfu"], summary["mfu"]);
    EXPECT_EQ(report["comparison"][i]["mfu"], summary["mfu"]);
    char mfu[64];
    std::snprintf(mfu, sizeof mfu, "| MFU | %.2f%% (", 100 * summary["mfu"].get<double>());
    EXPECT_NE(md.find(mfu), std::string::npos) << mfu;
    EXPECT_NE(md.find(summary["peak_source"].get<std::string>()), std::string::npos);
    // Every rank's monitor wrote its own samples.
    for (int rank = 0; rank < summary["world_size"].get<int>(); ++rank)
      EXPECT_GT(read_jsonl(dirs[i] / ("resources.rank" + std::to_string(rank) + ".jsonl")).size(), 0u);
  }
  const json s1 = read_json(one / "summary.json"), s2 = read_json(two / "summary.json");
  const auto& cmp = report["comparison"];
  EXPECT_DOUBLE_EQ(cmp[0]["speedup"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(cmp[1]["speedup"].get<double>(),
                   s1["train_seconds"].get<double>() / s2["train_seconds"].get<double>());
  EXPECT_DOUBLE_EQ(cmp[1]["throughput_ratio"].get<double>(),
                   s2["images_per_second"].get<double>() / s1["images_per_second"].get<double>());

  // One run alone: the report lands in its own directory.
  r = run_cohort({"report", two.string()}, 60);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(fs::exists(two / "report.md"));
  EXPECT_EQ(read_file(two / "report.md").find("## Comparison"), std::string::npos);

  // The trainer's TensorBoard scalars, decoded by protoc: training, validation and every rank's resources.
  if (std::system("command -v protoc > /dev/null 2>&1") != 0) {
    GTEST_SKIP() << "protoc not installed";
  }
  const std::string events = decoded_events(two, out / "record.bin");
  for (const char* tag : {"train/loss", "train/top1", "train/lr", "train/images_per_second", "train/mfu", "val/loss",
                          "val/top1", "val/top5", "memory/rss_mb/rank0", "memory/rss_mb/rank1", "cpu/percent/rank1"})
    EXPECT_NE(events.find(std::string("1: \"") + tag + "\""), std::string::npos) << tag;
  EXPECT_NE(events.find("brain.Event:2"), std::string::npos);
}

TEST(Logbook, ReportNamesARunThatDidNotFinish) {
  const auto dir = fresh_dir("logbook-unfinished");
  const auto r = run_cohort({"report", dir.string()}, 60);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find((dir / "summary.json").string()), std::string::npos) << r.output;
}

TEST(Logbook, FoundBatchFitsTheBudgetAndTwiceItDoesNot) {
  const auto dir = fresh_dir("logbook-batch");
  // A tiny model on one thread: each trial takes about a second. The budget sits 64 MiB above what the
  // process needs at batch 1 (libraries, the dataset), so activations decide. That base is measured
  // first: it depends on the LibTorch (0.41 GiB with pip's CUDA 2.14, more than a fixed 420M allowed).
  const auto trial_args = [&](int64_t batch, const std::string& budget) {
    return std::vector<std::string>{"find-batch-size",
                                    "--max-memory",
                                    budget,
                                    "--steps",
                                    "2",
                                    "--run-dir",
                                    dir.string(),
                                    "--start",
                                    std::to_string(batch),
                                    "--max-batch",
                                    std::to_string(batch),
                                    "--max-trials",
                                    "1",
                                    "model.width=8",
                                    "train.threads=1",
                                    "data.train_limit=4000"};
  };
  auto r = run_cohort(trial_args(1, "16G"), 200);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const int64_t base_mib = read_json(dir / "batch_size.json")["trials"][0]["peak_rss_bytes"].get<int64_t>() >> 20;
  const int64_t budget_mib = base_mib + 64;
  const std::string budget = std::to_string(budget_mib) + "M";
  const std::vector<std::string> args = {
      "find-batch-size", "--max-memory", budget,          "--steps",         "2",
      "--run-dir",       dir.string(),   "model.width=8", "train.threads=1", "data.train_limit=4000"};
  r = run_cohort(args, 400);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json found = read_json(dir / "batch_size.json");
  const int64_t b = found["batch_size"];
  EXPECT_GT(b, 2);
  EXPECT_EQ(found["limited_by"], "memory");
  EXPECT_EQ(found["max_memory_bytes"], budget_mib << 20);
  bool fit_seen = false, next_failed = false;
  for (const auto& t : found["trials"]) {
    if (t["batch_size"] == b)
      fit_seen = t["fits"].get<bool>() && t["peak_rss_bytes"].get<int64_t>() <= (budget_mib << 20);
    if (t["batch_size"] == b + 1) next_failed = !t["fits"].get<bool>();
  }
  EXPECT_TRUE(fit_seen && next_failed) << found.dump(1);

  // Independent re-checks, each a fresh single trial in the same directory (the trial's command line is
  // then the same as in the search: peak RSS moves by a few MiB with allocator layout, which depends even on
  // the length of the arguments). b must fit the budget within 2% (identical runs differ by about 0.2%);
  // 2b must not fit the budget itself.
  const std::string search_result = read_file(dir / "batch_size.json");
  const std::string budget_plus_2_percent = std::to_string(budget_mib * 102 / 100) + "M";
  for (const auto& [batch, limit, should_fit] :
       {std::tuple<int64_t, std::string, bool>{b, budget_plus_2_percent, true}, {2 * b, budget, false}}) {
    r = run_cohort(trial_args(batch, limit), 200);
    const json one = read_json(dir / "batch_size.json");
    ASSERT_EQ(one["trials"].size(), 1u) << r.output;
    EXPECT_EQ(one["trials"][0]["fits"].get<bool>(), should_fit) << "batch " << batch << ": " << one.dump(1);
    if (!should_fit) {
      EXPECT_NE(one["trials"][0]["why"].get<std::string>().find("peak RSS"), std::string::npos);
    }
  }
  std::ofstream(dir / "batch_size.json") << search_result;

  // The logbook of a run trained in that directory shows the batch found.
  r = cohort_train(quick_args(dir, {"--nproc-per-node", "1", "train.max_steps=3"}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_cohort({"report", dir.string()}, 60);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(read_file(dir / "report.md").find("**" + std::to_string(b) + "** per worker"), std::string::npos);
}

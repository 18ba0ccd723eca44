// `cohort train` as a user runs it: real launcher, real worker processes, real files.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>

#include "cohort/checkpoint/Safetensors.h"
#include "process/Harness.h"

namespace fs = std::filesystem;
using namespace cohort::testing;

TEST(TrainEndToEnd, TwoWorkersWriteSummaryMetricsAndCheckpoints) {
  const auto dir = fresh_dir("e2e");
  const auto r = cohort_train(quick_args(dir, {"--nproc-per-node", "2", "train.epochs=2"}));
  ASSERT_EQ(r.exit_code, 0) << r.output;

  const auto summary = read_json(dir / "summary.json");
  EXPECT_EQ(summary["world_size"], 2);
  // 1536 images / 2 ranks / 32 per batch = 24 steps per epoch.
  EXPECT_EQ(summary["steps"], 48);
  EXPECT_DOUBLE_EQ(summary["epochs"].get<double>(), 2.0);
  EXPECT_GT(summary["images_per_second"].get<double>(), 0);
  EXPECT_GT(summary["train_seconds"].get<double>(), 0);
  EXPECT_GT(summary["test_accuracy"].get<double>(), 0.3) << "a tiny ResNet learns something in 48 steps";
  EXPECT_GE(summary["best_test_accuracy"].get<double>(), summary["test_accuracy"].get<double>());
  // FLOPs and MFU (models/Flops.h, log/Peak.h): rank 0's count, the FLOP/s it implies, over the CPU's
  // measured peak for both workers.
  const double flops = summary["flops_per_image"].get<double>(), ips = summary["images_per_second"].get<double>();
  EXPECT_GT(flops, 1e6);
  EXPECT_NEAR(summary["achieved_tflops"].get<double>(), flops * ips / 1e12, 1e-9);
  const double peak = summary["peak_tflops_per_worker"].get<double>();
  EXPECT_GT(peak, 0);
  EXPECT_NEAR(summary["mfu"].get<double>(), flops * ips / (peak * 1e12 * 2), 1e-9);
  EXPECT_NE(summary["peak_source"].get<std::string>().find("measured here"), std::string::npos);
  ASSERT_EQ(summary["peak_rss_bytes"].size(), 2u);
  for (const auto& b : summary["peak_rss_bytes"]) EXPECT_GT(b.get<int64_t>(), 10 << 20);

  // Every training window's MFU: its own FLOP/s over the same peak (the first window's too: rank 0 counts
  // the FLOPs in its first step, before that step's window is written).
  const auto lines = read_jsonl(dir / "metrics.jsonl");
  int train = 0, eval = 0;
  for (const auto& l : lines) {
    train += l["kind"] == "train";
    eval += l["kind"] == "eval";
    if (l["kind"] != "train") continue;
    ASSERT_TRUE(l.contains("mfu")) << l.dump();
    EXPECT_NEAR(l["mfu"].get<double>(), l["achieved_tflops"].get<double>() / (peak * 2), 1e-12) << l.dump();
  }
  EXPECT_EQ(train, 48);
  EXPECT_EQ(eval, 2);

  for (const char* f : {"last.safetensors", "last.state.safetensors", "best.safetensors", "best.state.safetensors"})
    EXPECT_TRUE(fs::exists(dir / "checkpoints" / f)) << f;
  const auto weights = cohort::checkpoint::load_safetensors(dir / "checkpoints" / "last.safetensors");
  std::vector<std::string> names;
  for (const auto& [n, t] : weights.tensors) names.push_back(n);
  for (const char* expected :
       {"conv1.weight", "bn1.running_mean", "layer1.0.conv1.weight", "layer1.0.bn1.running_var",
        "layer2.0.downsample.0.weight", "layer2.0.downsample.1.num_batches_tracked", "fc.weight", "fc.bias"})
    EXPECT_NE(std::find(names.begin(), names.end(), expected), names.end()) << expected;
  // TensorBoard: one event file from rank 0 holding the file_version event, 8 training scalars (the 7th
  // and 8th: train/achieved_tflops and train/mfu, from the FLOPs rank 0 counts on its first step) and 3
  // resource scalars per rank (RSS, peak RSS, CPU; no GPU here) per log line (48), and 3 per evaluation
  // (2), in TFRecord framing that ends exactly at the end of the file.
  std::vector<fs::path> events;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0) events.push_back(e.path());
  ASSERT_EQ(events.size(), 1u);
  std::ifstream in(events[0], std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t at = 0, records = 0;
  while (at + 12 <= bytes.size()) {
    uint64_t len = 0;
    std::memcpy(&len, bytes.data() + at, sizeof len);
    at += 12 + len + 4;
    ++records;
  }
  EXPECT_EQ(at, bytes.size());
  EXPECT_EQ(records, 1u + 48 * (8 + 2 * 3) + 2 * 3);
  EXPECT_NE(bytes.find("train/achieved_tflops"), std::string::npos);
  EXPECT_NE(bytes.find("train/mfu"), std::string::npos);
  EXPECT_NE(bytes.find("train/loss"), std::string::npos);
  EXPECT_NE(bytes.find("val/top1"), std::string::npos);

  // Only rank 0 prints progress, with the window's MFU.
  EXPECT_NE(r.output.find("step 48/48"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(" img/s MFU "), std::string::npos) << r.output;
}

// eval.every_steps evaluates within the epoch too, and the epoch's end and the run's end once each.
TEST(TrainEndToEnd, EvalEveryStepsEvaluatesWithinTheEpoch) {
  const auto dir = fresh_dir("eval-every");
  // 1536 samples at batch 32 on one worker: 48 steps an epoch; max_steps 10 ends mid-epoch.
  const auto r = cohort_train(quick_args(dir, {"--nproc-per-node", "1", "train.max_steps=10", "eval.every_steps=4"}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<int64_t> evaluated;
  for (const auto& rec : read_jsonl(dir / "metrics.jsonl"))
    if (rec.value("kind", "") == "eval") evaluated.push_back(rec["step"].get<int64_t>());
  EXPECT_EQ(evaluated, (std::vector<int64_t>{4, 8, 10}));
}

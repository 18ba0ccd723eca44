// Mixed precision through `cohort train` on CPU, two real worker processes over Gloo: an inf/NaN injected
// into one rank's gradients makes every rank skip that step and halves the loss scale, which the metrics,
// rank 0's log and summary.json show; the scale survives a resume; bf16 trains; and precision modes that
// need a GPU say so.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "cohort/log/Peak.h"
#include "cohort/train/AutoSettings.h"
#include "process/Harness.h"

namespace fs = std::filesystem;
using namespace cohort::testing;

namespace {

std::map<int64_t, nlohmann::json> train_records(const fs::path& run_dir) {
  std::map<int64_t, nlohmann::json> out;
  for (const auto& r : read_jsonl(run_dir / "metrics.jsonl"))
    if (r.value("kind", "") == "train") out[r["step"].get<int64_t>()] = r;
  return out;
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

TEST(AmpProcess, OverflowOnOneRankSkipsTheStepEverywhereAndTheScaleResumes) {
  const auto dir = fresh_dir("amp-fp16");
  // Steps 3 (inf) and 6 (NaN) overflow on rank 1 only; a checkpoint after step 4 carries the scale.
  const std::map<std::string, std::string> env{{"COHORT_FAULT_NONFINITE_STEPS", "3,6"}, {"COHORT_FAULT_RANK", "1"}};
  auto args =
      quick_args(dir, {"--nproc-per-node", "2", "amp.precision=fp16", "train.max_steps=4", "ckpt.every_steps=4"});
  auto r = cohort_train(args, 240, env);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("amp.precision=fp16 on CPU"), std::string::npos) << r.output;
  EXPECT_EQ(count(r.output, "gradient overflow"), 1u) << r.output;  // rank 0 logs it, once
  EXPECT_NE(r.output.find("step 3: gradient overflow (inf/NaN) on some rank; skipped the update on every rank; "
                          "loss scale 65536 -> 32768"),
            std::string::npos)
      << r.output;

  // Resume to step 8: the scale continues from 32768, and step 6 halves it again.
  auto resumed = cohort_train(
      quick_args(dir, {"--nproc-per-node", "2", "amp.precision=fp16", "train.max_steps=8", "--resume", dir.string()}),
      240, env);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  const auto recs = train_records(dir);
  const std::map<int64_t, double> expected{{1, 65536}, {2, 65536}, {3, 32768}, {4, 32768},
                                           {5, 32768}, {6, 16384}, {7, 16384}, {8, 16384}};
  for (const auto& [step, scale] : expected) {
    ASSERT_TRUE(recs.count(step)) << "no metrics for step " << step;
    EXPECT_EQ(recs.at(step)["loss_scale"].get<double>(), scale) << "step " << step;
    EXPECT_TRUE(std::isfinite(recs.at(step)["loss"].get<double>())) << "step " << step;
  }
  EXPECT_EQ(recs.at(8)["skipped_steps"].get<int64_t>(), 2);
  const auto summary = read_json(dir / "summary.json");
  EXPECT_EQ(summary["precision"], "fp16");
  EXPECT_EQ(summary["amp"]["compute_dtype"], "float32");
  EXPECT_EQ(summary["amp"]["loss_scale"].get<double>(), 16384);
  EXPECT_EQ(summary["amp"]["skipped_steps"].get<int64_t>(), 2);
  EXPECT_TRUE(std::isfinite(summary["test_accuracy"].get<double>()));
}

TEST(AmpProcess, Bf16TrainsAndModesThatNeedAGpuSaySo) {
  const auto dir = fresh_dir("amp-bf16");
  const auto fp32_dir = fresh_dir("amp-fp32");
  auto r = cohort_train(
      quick_args(dir, {"--nproc-per-node", "2", "amp.precision=bf16", "dist.compress=bf16", "train.max_steps=6"}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto ref = cohort_train(quick_args(fp32_dir, {"--nproc-per-node", "2", "train.max_steps=6"}));
  ASSERT_EQ(ref.exit_code, 0) << ref.output;
  const auto summary = read_json(dir / "summary.json");
  EXPECT_EQ(summary["amp"]["compute_dtype"], "bfloat16");
  EXPECT_FALSE(summary["amp"].contains("loss_scale"));
  EXPECT_EQ(summary["device"], "cpu");
  // bf16 compute and bf16 gradients follow the fp32 run's losses within 5% relative over 6 steps.
  const auto losses = losses_by_step(dir), fp32 = losses_by_step(fp32_dir);
  ASSERT_EQ(losses.size(), 6u);
  for (const auto& [step, loss] : fp32) EXPECT_NEAR(losses.at(step), loss, 0.05 * loss) << "step " << step;

  auto master =
      cohort_train(quick_args(fresh_dir("amp-master"), {"--nproc-per-node", "1", "amp.precision=fp16-master"}));
  EXPECT_NE(master.exit_code, 0);
  EXPECT_NE(master.output.find("amp.precision=fp16-master needs a CUDA device"), std::string::npos) << master.output;
  auto cuda = cohort_train(quick_args(fresh_dir("amp-cuda"), {"--nproc-per-node", "1", "train.device=cuda"}));
  EXPECT_NE(cuda.exit_code, 0);
  EXPECT_NE(cuda.output.find("train.device=cuda, but this LibTorch sees no GPU"), std::string::npos) << cuda.output;
}

// Where the CPU has native bf16, auto weighs the measured bf16 and fp32 peaks (Note [What auto picks]): a
// peaks.json written beforehand (COHORT_CACHE) stands for a machine whose bf16 is slow, then for one
// whose bf16 is fast, and the run says which it picked and why. Elsewhere nothing is measured: skipped.
// About 5 s.
TEST(AmpProcess, AutoWeighsTheMeasuredBf16AndFp32Peaks) {
  if (!cohort::train::probe_cpu().cpu_bf16 || cohort::train::cpu_bf16_override())
    GTEST_SKIP() << "this CPU has no native bf16 (or COHORT_CPU_BF16 is set): auto measures nothing here";
  const auto cache = fresh_dir("amp-auto-peaks");
  auto run_with_peaks = [&](double bf16, double fp32) {
    const std::string id = cohort::log::cpu_identity();
    nlohmann::json peaks = {{id + " | bfloat16 | 1 thread(s)", {{"flops", bf16}, {"source", "this test"}}},
                            {id + " | float32 | 1 thread(s)", {{"flops", fp32}, {"source", "this test"}}}};
    std::ofstream(cache / "peaks.json") << peaks.dump();
    const auto dir = fresh_dir("amp-auto-peaks-run");
    auto r = cohort_train(
        quick_args(dir, {"--nproc-per-node", "2", "amp.precision=auto", "train.threads=1", "train.max_steps=2"}), 240,
        {{"COHORT_CACHE", cache.string()}});
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return std::make_pair(r.output, read_json(dir / "summary.json").value("precision", ""));
  };
  const auto [slow, slow_precision] = run_with_peaks(40e9, 100e9);
  EXPECT_EQ(slow_precision, "fp32");
  EXPECT_NE(slow.find("but here bf16 measured 40 GFLOP/s and fp32 100 GFLOP/s (peaks.json): bf16 needs 1.25x"),
            std::string::npos)
      << slow;
  const auto [fast, fast_precision] = run_with_peaks(400e9, 100e9);
  EXPECT_EQ(fast_precision, "bf16");
  EXPECT_NE(fast.find("measured 4.00x fp32's speed here"), std::string::npos) << fast;
}

// The defaults (amp.precision=auto, train.channels_last=auto) as `cohort train` runs them, with the CPU's
// bf16 units claimed and masked through COHORT_CPU_BF16 so both branches run on any machine: the choice
// is in the first line, summary.json, config.json and the checkpoint; a resume keeps it on a machine that
// would choose otherwise; an explicit value wins; the summary and the final line say where the time went.
TEST(AmpProcess, AutoPicksBf16AndChannelsLastWhereTheCpuHasBf16AndAResumeKeepsIt) {
  auto defaults = [](const fs::path& dir, std::vector<std::string> extra) {
    auto a = quick_args(dir, {"--nproc-per-node", "2", "amp.precision=auto", "train.channels_last=auto"});
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  const auto dir = fresh_dir("amp-auto-bf16");
  auto r = cohort_train(defaults(dir, {"train.max_steps=4", "ckpt.every_steps=4"}), 240, {{"COHORT_CPU_BF16", "1"}});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("precision bf16 (auto: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("COHORT_CPU_BF16=1 claims it"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("channels-last (auto: convolutional model on CPU"), std::string::npos) << r.output;
  auto summary = read_json(dir / "summary.json");
  EXPECT_EQ(summary["precision"], "bf16");
  EXPECT_EQ(summary["amp"]["compute_dtype"], "bfloat16");
  EXPECT_EQ(summary["channels_last"], true);
  EXPECT_EQ(summary["auto"]["precision"]["auto"], true);
  EXPECT_EQ(read_json(dir / "config.json")["amp.precision"], "bf16");
  EXPECT_EQ(read_json(dir / "config.json")["train.channels_last"], "true");
  // Where the time went: every phase of a step measured, shares adding up to the whole.
  const auto& t = summary["time_breakdown"];
  double shares = 0;
  for (const auto& [phase, share] : t["share"].items()) shares += share.get<double>();
  EXPECT_NEAR(shares, 1.0, 1e-6);
  for (const char* phase : {"data", "forward", "backward", "optimizer", "eval", "checkpoint"})
    EXPECT_GT(t["seconds"][phase].get<double>(), 0.0) << phase;
  EXPECT_EQ(t["per_rank"].size(), 2u);
  EXPECT_NE(r.output.find("; time: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("backward "), std::string::npos) << r.output;

  // Resumed where the CPU's bf16 is masked: the run keeps training in bf16, channels-last, whether the
  // saved config.json is the base (--resume) or the command line still says auto (as a restart's does).
  r = cohort_train({"--resume", dir.string(), "train.max_steps=6"}, 240, {{"COHORT_CPU_BF16", "0"}});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("precision bf16 (as saved in the checkpoint being resumed)"), std::string::npos) << r.output;
  summary = read_json(dir / "summary.json");
  EXPECT_EQ(summary["precision"], "bf16");
  EXPECT_EQ(summary["channels_last"], true);
  r = cohort_train(defaults(dir, {"train.max_steps=8", "train.resume=" + dir.string()}), 240,
                   {{"COHORT_CPU_BF16", "0"}});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("precision bf16 (auto: kept from the checkpoint being resumed)"), std::string::npos)
      << r.output;
  EXPECT_EQ(read_json(dir / "summary.json")["precision"], "bf16");

  // The same defaults with bf16 masked: fp32; an explicit bf16 wins over the mask, an explicit layout too.
  const auto masked = fresh_dir("amp-auto-masked");
  r = cohort_train(defaults(masked, {"train.max_steps=2"}), 240, {{"COHORT_CPU_BF16", "0"}});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("precision fp32 (auto: "), std::string::npos) << r.output;
  EXPECT_EQ(read_json(masked / "summary.json")["precision"], "fp32");
  const auto pinned = fresh_dir("amp-auto-pinned");
  r = cohort_train(defaults(pinned, {"train.max_steps=2", "amp.precision=bf16", "train.channels_last=false"}), 240,
                   {{"COHORT_CPU_BF16", "0"}});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("precision bf16 (set explicitly), contiguous layout (set explicitly)"), std::string::npos)
      << r.output;
  EXPECT_EQ(read_json(pinned / "summary.json")["channels_last"], false);
}

// Mixed precision through `cohort train` on CPU, two real worker processes over Gloo: an inf/NaN injected
// into one rank's gradients makes every rank skip that step and halves the loss scale, which the metrics,
// rank 0's log and summary.json show; the scale survives a resume; bf16 trains; and precision modes that
// need a GPU say so.
#include <gtest/gtest.h>

#include <cmath>

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
  auto args = quick_args(dir, {"--nproc-per-node", "2", "amp.precision=fp16", "train.max_steps=4", "ckpt.every_steps=4"});
  auto r = cohort_train(args, 240, env);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("amp.precision=fp16 on CPU"), std::string::npos) << r.output;
  EXPECT_EQ(count(r.output, "gradient overflow"), 1u) << r.output;  // rank 0 logs it, once
  EXPECT_NE(r.output.find("step 3: gradient overflow (inf/NaN) on some rank; skipped the update on every rank; "
                          "loss scale 65536 -> 32768"),
            std::string::npos)
      << r.output;

  // Resume to step 8: the scale continues from 32768, and step 6 halves it again.
  auto resumed = cohort_train(quick_args(dir, {"--nproc-per-node", "2", "amp.precision=fp16", "train.max_steps=8",
                                               "--resume", dir.string()}),
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
  auto r = cohort_train(quick_args(dir, {"--nproc-per-node", "2", "amp.precision=bf16", "dist.grad_dtype=bf16",
                                         "train.max_steps=6"}));
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

  auto master = cohort_train(quick_args(fresh_dir("amp-master"), {"--nproc-per-node", "1", "amp.precision=fp16-master"}));
  EXPECT_NE(master.exit_code, 0);
  EXPECT_NE(master.output.find("amp.precision=fp16-master needs a CUDA device"), std::string::npos) << master.output;
  auto cuda = cohort_train(quick_args(fresh_dir("amp-cuda"), {"--nproc-per-node", "1", "train.device=cuda"}));
  EXPECT_NE(cuda.exit_code, 0);
  EXPECT_NE(cuda.output.find("train.device=cuda, but this LibTorch sees no GPU"), std::string::npos) << cuda.output;
}

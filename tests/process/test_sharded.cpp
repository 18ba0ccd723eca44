// zero1 / zero2 / fsdp through the real `cohort` binary: sharded checkpoints that resume exactly at the
// same world size and reshard to another, `cohort export`, measured model-state bytes in summary.json.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include <torch/torch.h>

#include "cohort/checkpoint/Safetensors.h"
#include "cohort/checkpoint/Steps.h"
#include "process/Harness.h"

namespace fs = std::filesystem;
using namespace cohort::testing;

namespace {

std::vector<std::string> with(const fs::path& dir, std::vector<std::string> extra) {
  std::vector<std::string> common{"train.epochs=2", "eval.enabled=false",  "optim.name=adamw",
                                  "optim.lr=0.003", "dist.bucket_mb=0.01", "dist.first_bucket_mb=0.01"};
  common.insert(common.end(), extra.begin(), extra.end());
  return quick_args(dir, common);
}

TEST(ShardedTrain, FsdpResumesBitwiseAndReshardsFrom2To3Workers) {
  const int k = 10;
  const auto full = fresh_dir("sharded-full");
  auto r = cohort_train(
      with(full, {"--nproc-per-node", "2", "dist.strategy=fsdp", "train.max_steps=" + std::to_string(2 * k)}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(fs::exists(full / "checkpoints" / "last.shard-00001-of-00002.safetensors"));
  // One commit marker per save: the step directory's COMMIT, no last.commit beside it.
  const auto steps = cohort::checkpoint::list_step_dirs(full / "checkpoints");
  ASSERT_FALSE(steps.empty());
  EXPECT_TRUE(fs::exists(steps.front().path / "COMMIT"));
  EXPECT_FALSE(fs::exists(steps.front().path / "last.commit"));
  EXPECT_FALSE(fs::exists(full / "checkpoints" / "last.safetensors")) << "fsdp writes shards, not a full file";

  const auto part = fresh_dir("sharded-part");
  r = cohort_train(with(part, {"--nproc-per-node", "2", "dist.strategy=fsdp", "train.max_steps=" + std::to_string(k)}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto resharded = fresh_dir("sharded-resharded");
  fs::copy(part, resharded, fs::copy_options::recursive | fs::copy_options::overwrite_existing);

  // Same world size: the same losses and bitwise the same weights as the uninterrupted run.
  r = cohort_train({"--nproc-per-node", "2", "--resume", part.string(), "train.max_steps=" + std::to_string(2 * k)});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resuming at step " + std::to_string(k)), std::string::npos) << r.output;
  const auto a = step_losses(full, k), b = step_losses(part, k);
  ASSERT_EQ(a.size(), static_cast<size_t>(k));
  ASSERT_EQ(b.size(), static_cast<size_t>(k));
  for (int i = 0; i < k; ++i) EXPECT_EQ(a[i], b[i]) << "step " << k + i + 1;

  for (const auto& dir : {full, part}) {
    r = run_cohort({"export", dir.string(), "--out", (dir / "model.safetensors").string()});
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  const auto wa = cohort::checkpoint::load_safetensors(full / "model.safetensors");
  const auto wb = cohort::checkpoint::load_safetensors(part / "model.safetensors");
  ASSERT_EQ(wa.tensors.size(), wb.tensors.size());
  std::set<std::string> names;
  for (size_t i = 0; i < wa.tensors.size(); ++i) {
    EXPECT_EQ(wa.tensors[i].first, wb.tensors[i].first);
    EXPECT_TRUE(torch::equal(wa.tensors[i].second, wb.tensors[i].second)) << wa.tensors[i].first;
    names.insert(wa.tensors[i].first);
  }
  // torchvision names, buffers included: the export is an ordinary weights file.
  EXPECT_TRUE(names.count("layer1.0.conv1.weight") && names.count("fc.bias") && names.count("bn1.running_mean"));
  EXPECT_EQ(wb.metadata.at("step"), std::to_string(2 * k));
  // `cohort eval` takes the run directory itself and reassembles the sharded checkpoint.
  r = run_cohort({"eval", "--checkpoint", part.string(), "model.name=resnet8", "model.width=4", "data.test_limit=500",
                  "--out", (part / "eval.json").string()});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(read_json(part / "eval.json")["images"], 500);

  // Another world size: 3 workers pick up the 2-worker shards; the slices are rewritten for 3.
  r = cohort_train(
      {"--nproc-per-node", "3", "--resume", resharded.string(), "train.max_steps=" + std::to_string(k + 4)});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resuming at step " + std::to_string(k)), std::string::npos) << r.output;
  EXPECT_TRUE(fs::exists(resharded / "checkpoints" / "last.shard-00002-of-00003.safetensors"));
  EXPECT_FALSE(fs::exists(resharded / "checkpoints" / "last.shard-00001-of-00002.safetensors")) << "stale slices stay";
  const auto losses = step_losses(resharded, k);
  ASSERT_EQ(losses.size(), 4u);
  for (double l : losses) EXPECT_TRUE(std::isfinite(l) && l < 3.0) << l;
}

TEST(ShardedTrain, SummaryReportsPerRankModelStateBytesThatShrinkWithSharding) {
  std::map<std::string, int64_t> total;
  for (const std::string strategy : {"ddp", "zero1", "zero2", "fsdp"}) {
    const auto dir = fresh_dir("sharded-bytes-" + strategy);
    auto r = cohort_train(with(dir, {"--nproc-per-node", "2", "dist.strategy=" + strategy, "train.max_steps=2"}));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto s = read_json(dir / "summary.json");
    EXPECT_EQ(s["strategy"], strategy);
    ASSERT_EQ(s["resources"].size(), 2u);
    for (const auto& rank : s["resources"]) {
      const auto& b = rank["model_state_bytes"];
      EXPECT_GT(b["params"].get<int64_t>(), 0);
      EXPECT_GT(b["optimizer"].get<int64_t>(), 0) << strategy << ": AdamW state was not counted";
      EXPECT_EQ(b["total"].get<int64_t>(),
                b["params"].get<int64_t>() + b["grads"].get<int64_t>() + b["optimizer"].get<int64_t>());
    }
    total[strategy] = s["resources"][0]["model_state_bytes"]["total"].get<int64_t>();
    // MFU in every strategy's summary (issue 44): the same FLOPs per image over the same peak as ddp's.
    EXPECT_GT(s["mfu"].get<double>(), 0) << strategy;
    EXPECT_NEAR(s["mfu"].get<double>(),
                s["flops_per_image"].get<double>() * s["images_per_second"].get<double>() /
                    (s["peak_tflops_per_worker"].get<double>() * 1e12 * 2),
                1e-9)
        << strategy;
    bool logged = false;
    for (const auto& l : read_jsonl(dir / "metrics.jsonl")) logged |= l["kind"] == "model_state";
    EXPECT_TRUE(logged);
  }
  EXPECT_LT(total["zero1"], total["ddp"]);
  EXPECT_LT(total["zero2"], total["zero1"]);
  EXPECT_LT(total["fsdp"], total["zero2"]);
}

TEST(ShardedTrain, ANonFiniteGradientStopsTheRunWithANamedStep) {
  // fp32 has no loss scale to lower: an inf or NaN gradient is divergence. Every rank learns of it in
  // the same step (an inf in one rank's slice reaches all through the step's all-reduce), so all stop.
  for (const std::string strategy : {"ddp", "fsdp"}) {
    const auto dir = fresh_dir("sharded-nan-" + strategy);
    auto r = cohort_train(quick_args(dir, {"--nproc-per-node", "2", "dist.strategy=" + strategy, "optim.lr=1e30",
                                           "train.max_steps=20", "eval.enabled=false"}));
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("the gradient holds inf or NaN"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("lower optim.lr or set optim.clip_grad_norm"), std::string::npos) << r.output;
  }
}

TEST(ShardedTrain, CompressionWithAShardedStrategyIsAConfigError) {
  const auto dir = fresh_dir("sharded-bad-config");
  auto r = cohort_train(with(dir, {"--nproc-per-node", "1", "dist.strategy=zero2", "dist.compress=powersgd"}));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("works with dist.strategy=ddp only"), std::string::npos) << r.output;
}

}  // namespace

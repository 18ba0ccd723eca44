// Resume determinism (llm.c's test_gpt2 idea): train k, save, train k more; a second run stops at k,
// resumes and trains k: the same losses and bitwise the same weights as the uninterrupted run.
#include <gtest/gtest.h>

#include <fstream>
#include <map>

#include <torch/torch.h>

#include "cohort/checkpoint/Safetensors.h"
#include "cohort/checkpoint/Steps.h"
#include "process/Harness.h"

namespace fs = std::filesystem;
using namespace cohort::testing;

namespace {
// `stop_env` stops the first part at step k: without it, train.max_steps=k does; with it, a fault it
// names (a preemption warning) must stop the run at k by itself, with max_steps left at 2k.
void expect_exact_resume(const std::string& name, const std::vector<std::string>& extra_args,
                         const std::map<std::string, std::string>& stop_env = {}, const int k = 14) {
  // 1536 images / 2 ranks / batch 32 = 24 steps an epoch: the resumed half crosses an epoch boundary.
  std::vector<std::string> common{"--nproc-per-node", "2", "train.epochs=2", "eval.enabled=false"};
  common.insert(common.end(), extra_args.begin(), extra_args.end());
  auto with = [&](const fs::path& dir, std::vector<std::string> extra) {
    auto a = quick_args(dir, common);
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  const auto full = fresh_dir(name + "-full");
  auto r = cohort_train(with(full, {"train.max_steps=" + std::to_string(2 * k)}));
  ASSERT_EQ(r.exit_code, 0) << r.output;

  const auto part = fresh_dir(name + "-part");
  r = cohort_train(with(part, {"train.max_steps=" + std::to_string(stop_env.empty() ? k : 2 * k)}), 240, stop_env);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  if (!stop_env.empty()) {
    EXPECT_NE(r.output.find("SIGUSR1: leaving after step " + std::to_string(k)), std::string::npos) << r.output;
    const auto s = read_json(part / "summary.json");
    EXPECT_EQ(s["stopped_by"], "SIGUSR1");
    EXPECT_EQ(s["steps"], k);
  }
  std::vector<std::string> resume_args{"--nproc-per-node", "2", "--resume", part.string(),
                                       "train.max_steps=" + std::to_string(2 * k)};
  resume_args.insert(resume_args.end(), extra_args.begin(), extra_args.end());
  r = cohort_train(resume_args);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resuming at step " + std::to_string(k)), std::string::npos) << r.output;

  const auto a = step_losses(full, k), b = step_losses(part, k);
  ASSERT_EQ(a.size(), static_cast<size_t>(k));
  ASSERT_EQ(b.size(), static_cast<size_t>(k));
  for (int i = 0; i < k; ++i) EXPECT_EQ(a[i], b[i]) << "step " << k + i + 1;

  const auto wa = cohort::checkpoint::load_safetensors(full / "checkpoints" / "last.safetensors");
  const auto wb = cohort::checkpoint::load_safetensors(part / "checkpoints" / "last.safetensors");
  ASSERT_EQ(wa.tensors.size(), wb.tensors.size());
  for (size_t i = 0; i < wa.tensors.size(); ++i)
    EXPECT_TRUE(torch::equal(wa.tensors[i].second, wb.tensors[i].second)) << wa.tensors[i].first;
  EXPECT_EQ(wb.metadata.at("step"), std::to_string(2 * k));
}

}  // namespace

TEST(Resume, InterruptedRunMatchesUninterruptedBitwise) { expect_exact_resume("resume", {}); }

// PowerSGD carries state across steps (each rank's residual, the warm-started Q); the checkpoint holds
// it, so a resumed run compresses exactly as the uninterrupted one did.
// Slurm's warning before a preemption (--signal=USR1@SECONDS) that reached one rank only, after step 14:
// both ranks agree to stop after step 20 (the ranks compare notes every 10 steps), save, exit 0, and the
// resumed run is the uninterrupted one.
TEST(Resume, APreemptionWarningToOneRankStopsEveryRankAtOneStepAndResumesBitwise) {
  expect_exact_resume("preempted", {}, {{"COHORT_FAULT_USR1_STEP", "14"}, {"COHORT_FAULT_RANK", "1"}}, 20);
}

TEST(Resume, PowerSgdStateResumesBitwise) {
  expect_exact_resume("resume-powersgd", {"dist.compress=powersgd", "powersgd.start_iter=5", "powersgd.rank=2"});
}

TEST(Resume, MissingOrDamagedCheckpointIsNamed) {
  const auto dir = fresh_dir("resume-bad");
  auto r = cohort_train({"--nproc-per-node", "1", "--resume", dir.string()});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("nothing to resume in '" + dir.string()), std::string::npos) << r.output;

  r = cohort_train(quick_args(dir, {"--nproc-per-node", "1", "train.max_steps=2", "eval.enabled=false"}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto state = dir / "checkpoints" / "last.state.safetensors";
  fs::resize_file(state, fs::file_size(state) / 2);
  r = cohort_train({"--nproc-per-node", "1", "--resume", dir.string()});
  EXPECT_NE(r.exit_code, 0);
  // The only save is named with what is wrong with it (checkpoints/Steps.h).
  EXPECT_NE(r.output.find("step-00000002: file last.state.safetensors has"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("no complete checkpoint to resume from"), std::string::npos) << r.output;
  // The weights file of the earlier save is untouched by the failed resume.
  EXPECT_NO_THROW(cohort::checkpoint::load_safetensors(dir / "checkpoints" / "last.safetensors"));
  fs::remove_all(dir);
  r = cohort_train(quick_args(dir, {"--nproc-per-node", "1", "train.max_steps=2", "eval.enabled=false"}));
  ASSERT_EQ(r.exit_code, 0) << r.output;

  // One flipped bit in the weights, with sizes and header intact: the checksum names the file.
  const auto weights = dir / "checkpoints" / "last.safetensors";
  std::string bytes = read_file(weights);
  bytes[bytes.size() - 40] ^= 0x10;
  std::ofstream(weights, std::ios::binary | std::ios::trunc) << bytes;
  r = cohort_train({"--nproc-per-node", "1", "--resume", dir.string()});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("last.safetensors' is damaged: its data has CRC-32C"), std::string::npos) << r.output;
}

// A periodic save (ckpt.every_steps) that falls on the last step of an epoch waits for that epoch's
// evaluation, so the step is saved once with the best accuracy it found, not as step-N and step-N.1.
TEST(Resume, APeriodicSaveAtTheEndOfAnEpochIsWrittenOnce) {
  const auto dir = fresh_dir("save-once");
  // 1536 images / 2 ranks / batch 32 = 24 steps an epoch: saves at 12, 24 (an epoch's end), 36 and 48.
  auto r = cohort_train(
      quick_args(dir, {"--nproc-per-node", "2", "train.epochs=2", "ckpt.every_steps=12", "ckpt.keep_last=10"}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<int64_t> steps;
  for (const auto& d : cohort::checkpoint::list_step_dirs(dir / "checkpoints")) {
    EXPECT_EQ(d.serial, 0) << d.path << ": step " << d.step << " was saved twice";
    steps.push_back(d.step);
  }
  EXPECT_EQ(steps, (std::vector<int64_t>{48, 36, 24, 12}));
}

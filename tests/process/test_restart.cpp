// --max-restarts: a worker killed mid-run (SIGKILL, injected with COHORT_FAULT_STEP) makes the launcher
// stop the group and start it again; the new workers resume from the last checkpoint and the run ends
// with weights bitwise identical to an uninterrupted run (CPU training is deterministic here: sampling
// and augmentation are pure functions of (seed, epoch, index), and resume restores everything else).
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <map>
#include <thread>

#include <torch/torch.h>

#include "cohort/checkpoint/Safetensors.h"
#include "process/Harness.h"

namespace fs = std::filesystem;
using namespace cohort::testing;

TEST(Restart, AKilledWorkerIsRestartedAndTheRunEndsBitwiseAsUninterrupted) {
  const std::vector<std::string> common{
      "--nproc-per-node", "2", "train.max_steps=24", "ckpt.every_steps=8", "eval.enabled=false", "log.progress=plain"};
  const auto full = fresh_dir("restart-full");
  auto r = cohort_train(quick_args(full, common));
  ASSERT_EQ(r.exit_code, 0) << r.output;

  const auto faulty = fresh_dir("restart-faulty");
  auto args = quick_args(faulty, common);
  args.insert(args.end(), {"--max-restarts", "2"});
  Proc launcher(cohort_argv(args), {{"COHORT_FAULT_STEP", "13"}, {"COHORT_FAULT_RANK", "1"}});
  // Restart-to-first-step: from the launcher's restart line to the first step the new workers log.
  double restart_to_step = -1;
  std::chrono::steady_clock::time_point restarted{};
  const auto start = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - start < std::chrono::seconds(240)) {
    const auto out = launcher.output_so_far();
    const auto at = out.find("restarting all 2 local worker(s) (restart 1 of 2)");
    if (at != std::string::npos && restarted == std::chrono::steady_clock::time_point{})
      restarted = std::chrono::steady_clock::now();
    if (at != std::string::npos && out.find(" step 9/", at) != std::string::npos) {
      restart_to_step = std::chrono::duration<double>(std::chrono::steady_clock::now() - restarted).count();
      break;
    }
    if (out.find("cohort: done:") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  r = launcher.wait(240);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("worker rank 1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("signal 9 (SIGKILL)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("restart 1: resuming from"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("restart 2 of 2"), std::string::npos) << "one failure, one restart: " << r.output;
  EXPECT_GT(restart_to_step, 0) << r.output;
  EXPECT_EQ(read_json(faulty / "summary.json")["restarts"], 1);

  const auto a = losses_by_step(full), b = losses_by_step(faulty);
  ASSERT_EQ(a.size(), 24u);
  ASSERT_EQ(b.size(), 24u);
  for (int64_t s = 9; s <= 24; ++s) EXPECT_EQ(a.at(s), b.at(s)) << "step " << s;
  const auto wa = cohort::checkpoint::load_safetensors(full / "checkpoints" / "last.safetensors");
  const auto wb = cohort::checkpoint::load_safetensors(faulty / "checkpoints" / "last.safetensors");
  ASSERT_EQ(wa.tensors.size(), wb.tensors.size());
  for (size_t i = 0; i < wa.tensors.size(); ++i)
    EXPECT_TRUE(torch::equal(wa.tensors[i].second, wb.tensors[i].second)) << wa.tensors[i].first;
  std::ofstream(faulty / "restart.json")
      << nlohmann::json{{"faults_injected", 1}, {"faults_survived", 1},   {"restart_to_first_step_s", restart_to_step},
                        {"workers", 2},         {"resumed_from_step", 8}, {"bitwise_equal_to_uninterrupted", true}}
             .dump(1)
      << "\n";
}

TEST(Restart, WithoutRestartsLeftTheJobFailsNamingTheWorker) {
  const auto dir = fresh_dir("restart-none");
  const auto r = cohort_train(
      quick_args(dir, {"--nproc-per-node", "2", "train.max_steps=12", "eval.enabled=false", "--max-restarts", "0"}),
      120, {{"COHORT_FAULT_STEP", "4"}});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("worker rank 1"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("restarting"), std::string::npos) << r.output;
}

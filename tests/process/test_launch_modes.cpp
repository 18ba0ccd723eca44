// The same job started the ways users start it: two "machines" (launchers) on loopback, and torchrun.
#include <gtest/gtest.h>

#include <cstdlib>

#include "process/Harness.h"

namespace fs = std::filesystem;
using namespace cohort::testing;

TEST(LaunchModes, TwoNodesOnLoopback) {
  const auto dir = fresh_dir("two-nodes");
  const std::vector<std::string> common{"--nnodes", "2", "--nproc-per-node", "1", "--master-addr", "127.0.0.1",
                                        "--master-port", "29741", "train.max_steps=6"};
  auto a0 = quick_args(dir, common), a1 = quick_args(dir, common);
  a0.insert(a0.end(), {"--node-rank", "0"});
  a1.insert(a1.end(), {"--node-rank", "1"});
  Proc n0(cohort_argv(a0)), n1(cohort_argv(a1));
  const auto r0 = n0.wait(120), r1 = n1.wait(120);
  ASSERT_EQ(r0.exit_code, 0) << r0.output;
  ASSERT_EQ(r1.exit_code, 0) << r1.output;
  const auto s = read_json(dir / "summary.json");
  EXPECT_EQ(s["world_size"], 2);
  EXPECT_EQ(s["nnodes"], 2);
  EXPECT_EQ(s["steps"], 6);
}

TEST(LaunchModes, UnderTorchrun) {
  if (std::system("command -v torchrun > /dev/null 2>&1") != 0)
    FAIL() << "torchrun not found: install python3-torch (make deps does)";
  const auto dir = fresh_dir("torchrun");
  std::vector<std::string> argv{"torchrun", "--nproc_per_node", "2", "--master_port", "29751", "--no_python",
                                COHORT_BINARY, "train"};
  const auto args = quick_args(dir, {"train.max_steps=4"});
  argv.insert(argv.end(), args.begin(), args.end());
  const auto r = run(argv, 180);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto s = read_json(dir / "summary.json");
  EXPECT_EQ(s["world_size"], 2);
  EXPECT_EQ(s["launcher"], "torchrun");
}

// The same job started the ways users start it: two "machines" (launchers) on loopback, and torchrun.
#include <gtest/gtest.h>

#include <map>

#include <cstdlib>

#include <unistd.h>

#include "cohort/util/TorchCompat.h"
#include "process/Harness.h"

namespace fs = std::filesystem;
using namespace cohort::testing;

TEST(LaunchModes, TwoNodesOnLoopback) {
  const auto dir = fresh_dir("two-nodes");
  const std::vector<std::string> common{"--nnodes",      "2",     "--nproc-per-node", "1", "--master-addr", "127.0.0.1",
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

// Two machines with --max-restarts: a worker killed on node 1 restarts the workers of both nodes in the
// same launcher rendezvous round, and they resume together from the checkpoint.
TEST(LaunchModes, TwoNodesRestartTogetherAfterAFailureOnOne) {
  const auto dir = fresh_dir("two-nodes-restart");
  const std::vector<std::string> common{"--nnodes",           "2",
                                        "--nproc-per-node",   "1",
                                        "--master-addr",      "127.0.0.1",
                                        "--master-port",      "29745",
                                        "--max-restarts",     "1",
                                        "train.max_steps=12", "ckpt.every_steps=4",
                                        "eval.enabled=false", "log.progress=plain"};
  auto a0 = quick_args(dir, common), a1 = quick_args(dir, common);
  a0.insert(a0.end(), {"--node-rank", "0"});
  a1.insert(a1.end(), {"--node-rank", "1"});
  const std::map<std::string, std::string> fault{{"COHORT_FAULT_STEP", "6"}, {"COHORT_FAULT_RANK", "1"}};
  Proc n0(cohort_argv(a0), fault), n1(cohort_argv(a1), fault);
  const auto r0 = n0.wait(180), r1 = n1.wait(180);
  ASSERT_EQ(r0.exit_code, 0) << r0.output << "\n---- node 1:\n" << r1.output;
  ASSERT_EQ(r1.exit_code, 0) << r1.output;
  EXPECT_NE(r1.output.find("worker rank 1"), std::string::npos) << r1.output;
  EXPECT_NE(r0.output.find("round 1: 2 machine(s)"), std::string::npos) << r0.output;
  EXPECT_NE(r0.output.find("restart 1: resuming from"), std::string::npos) << r0.output;
  const auto s = read_json(dir / "summary.json");
  EXPECT_EQ(s["restarts"], 1);
  EXPECT_EQ(s["steps"], 12);
}

// torchrun's contract without torchrun: Debian 12's torchrun (1.13 on Python 3.11) crashes in its own
// argument handling before starting any worker ('NoneType' object has no attribute 'get' in to_map), so
// this test plays the elastic agent: it hosts the store, as torchrun's agent does with
// TORCHELASTIC_USE_AGENT_STORE=True, and gives the workers torchrun's full environment.
TEST(LaunchModes, UnderTorchrunEnvironmentWithAgentStore) {
  const int port = 29771;
  auto store = c10::make_intrusive<c10d::TCPStore>(
      "127.0.0.1", cohort::util::compat::tcp_store_options(port, /*is_server=*/true, 3, std::chrono::seconds(60)));
  const auto dir = fresh_dir("torchrun-env");
  std::vector<std::unique_ptr<Proc>> ps;
  for (int r = 0; r < 2; ++r)
    ps.push_back(std::make_unique<Proc>(cohort_argv(quick_args(dir, {"train.max_steps=4"})),
                                        std::map<std::string, std::string>{{"RANK", std::to_string(r)},
                                                                           {"LOCAL_RANK", std::to_string(r)},
                                                                           {"WORLD_SIZE", "2"},
                                                                           {"LOCAL_WORLD_SIZE", "2"},
                                                                           {"GROUP_RANK", "0"},
                                                                           {"MASTER_ADDR", "127.0.0.1"},
                                                                           {"MASTER_PORT", std::to_string(port)},
                                                                           {"TORCHELASTIC_RUN_ID", "test"},
                                                                           {"TORCHELASTIC_RESTART_COUNT", "0"},
                                                                           {"TORCHELASTIC_MAX_RESTARTS", "0"},
                                                                           {"TORCHELASTIC_USE_AGENT_STORE", "True"}}));
  for (auto& p : ps) {
    const auto r = p->wait(120);
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  const auto s = read_json(dir / "summary.json");
  EXPECT_EQ(s["world_size"], 2);
  EXPECT_EQ(s["launcher"], "torchrun");
  // The workers used the agent's store under torchrun's per-attempt prefix.
  EXPECT_TRUE(store->check({"/worker/attempt_0/cohort/run_dir"}));
}

// Open MPI's mpirun (Debian's openmpi-bin) starts the workers: they read OMPI_COMM_WORLD_* and meet in
// rank 0's store at MASTER_ADDR:MASTER_PORT, which mpirun passes on with -x.
TEST(LaunchModes, UnderOpenMpiMpirun) {
  if (std::system("command -v mpirun > /dev/null 2>&1") != 0)
    GTEST_SKIP() << "mpirun is not installed (scripts/install-deps installs openmpi-bin)";
  const auto dir = fresh_dir("mpirun");
  std::vector<std::string> argv{
      "mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", "-x", "MASTER_ADDR=127.0.0.1",
      "-x",     "MASTER_PORT=29781"};
  const auto cohort = cohort_argv(quick_args(dir, {"train.max_steps=4"}));
  argv.insert(argv.end(), cohort.begin(), cohort.end());
  Proc p(argv);
  const auto r = p.wait(180);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto s = read_json(dir / "summary.json");
  EXPECT_EQ(s["launcher"], "mpi");
  EXPECT_EQ(s["world_size"], 2);
  EXPECT_EQ(s["steps"], 4);
}

// Open MPI across two "machines": network namespaces on a bridge, each with its own address. mpirun
// starts its daemon in the other one through tests/mpi/netns-rsh, the remote-shell agent a cluster would
// have as ssh, so the ranks reach each other (Gloo, and rank 0's store with the job's secret) over the
// bridge as over a network. About 2 s.
TEST(LaunchModes, UnderOpenMpiMpirunAcrossTwoNetworkNamespaces) {
  if (std::system("command -v mpirun > /dev/null 2>&1") != 0)
    GTEST_SKIP() << "mpirun is not installed (scripts/install-deps installs openmpi-bin)";
  if (geteuid() != 0 || std::system("command -v ip > /dev/null 2>&1") != 0)
    GTEST_SKIP() << "needs root and iproute2 for network namespaces";
  const std::string setup =
      "ip netns add cmpi-hub && ip -n cmpi-hub link add br0 type bridge && ip -n cmpi-hub link set br0 up && "
      "for i in 0 1; do ip netns add cmpi-$i && ip -n cmpi-$i link set lo up && "
      "ip link add cmpi-v$i netns cmpi-$i type veth peer name cmpi-h$i netns cmpi-hub && "
      "ip -n cmpi-$i addr add 10.83.0.$((i+1))/24 dev cmpi-v$i && ip -n cmpi-$i link set cmpi-v$i up && "
      "ip -n cmpi-hub link set cmpi-h$i master br0 && ip -n cmpi-hub link set cmpi-h$i up || exit 1; done";
  const std::string teardown = "for n in cmpi-hub cmpi-0 cmpi-1; do ip netns del $n 2>/dev/null; done; true";
  std::system(("sh -c '" + teardown + "'").c_str());
  ASSERT_EQ(std::system(("sh -c '" + setup + "'").c_str()), 0) << "could not create the namespaces";
  const auto dir = fresh_dir("mpirun-netns");
  const std::string agent = fs::path(COHORT_SOURCE_DIR) / "tests" / "mpi" / "netns-rsh";
  // mpirun runs on "machine" 0 under that machine's own hostname, as the agent runs machine 1's daemon
  // (tests/mpi/netns-rsh): Open MPI 5 matches the --host entries to the nodes by hostname.
  std::vector<std::string> argv{"ip",
                                "netns",
                                "exec",
                                "cmpi-0",
                                "unshare",
                                "--uts",
                                "sh",
                                "-c",
                                "echo 10.83.0.1 > /proc/sys/kernel/hostname && exec \"$@\"",
                                "sh",
                                "mpirun",
                                "--allow-run-as-root",
                                "--mca",
                                "plm_rsh_agent",
                                agent,
                                "--mca",
                                "oob_tcp_if_include",
                                "10.83.0.0/24",
                                "--mca",
                                "btl",
                                "self,tcp",
                                "--host",
                                "10.83.0.1:1,10.83.0.2:1",
                                "-np",
                                "2",
                                "-x",
                                "MASTER_ADDR=10.83.0.1",
                                "-x",
                                "MASTER_PORT=29782",
                                "-x",
                                "COHORT_TOKEN=" + std::string(64, '7')};
  const auto cohort = cohort_argv(quick_args(dir, {"train.max_steps=4"}));
  argv.insert(argv.end(), cohort.begin(), cohort.end());
  Proc p(argv);
  const auto r = p.wait(180);
  std::system(("sh -c '" + teardown + "'").c_str());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto s = read_json(dir / "summary.json");
  EXPECT_EQ(s["launcher"], "mpi");
  EXPECT_EQ(s["world_size"], 2);
  EXPECT_EQ(s["steps"], 4);
}

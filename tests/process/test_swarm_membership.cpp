// Peers coming and going in a running swarm (ctest label swarm, `make test-swarm`): Ctrl-C on a peer, the
// same peer restarted from its checkpoint, a donor dying while a newcomer downloads, four peers started
// at once, the bootstrap peer killed, and a link going down mid-round (network namespaces: root only). Each peer is a
// real `cohort train` on its own loopback address.
#include <gtest/gtest.h>

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <thread>

#include "process/Harness.h"
#include "process/SwarmPeers.h"

namespace cohort::testing {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

// Waits until `p` has printed `needle` (false after `timeout_s`).
bool wait_for_output(const Proc& p, const std::string& needle, double timeout_s = 120) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (std::chrono::steady_clock::now() < deadline) {
    if (p.output_so_far().find(needle) != std::string::npos) return true;
    std::this_thread::sleep_for(50ms);
  }
  return false;
}

double number_after(const std::string& text, const std::string& before) {
  const auto at = text.find(before);
  return at == std::string::npos ? -1 : std::stod(text.substr(at + before.size()));
}

// The longest round a peer logged for steps first..last (metrics.jsonl: a record per step with
// log.every_steps=1).
double longest_round(const fs::path& dir, int64_t first, int64_t last) {
  double worst = 0;
  for (const auto& rec : read_jsonl(dir / "metrics.jsonl")) {
    const int64_t step = rec.value("step", int64_t{0});
    if (rec.contains("swarm_round_seconds") && step >= first && step <= last)
      worst = std::max(worst, rec["swarm_round_seconds"].get<double>());
  }
  return worst;
}

// Ctrl-C on a peer's launcher: the peer finishes its round, says it leaves, saves `last` and its summary;
// the others do not wait a matchmaking period for it. Restarted with --resume, it loads its checkpoint,
// downloads the swarm's newer state and ends with the others' weights.
TEST(SwarmLong, CtrlCLeavesCleanlyAndTheRestartedPeerCatchesUp) {
  SKIP_WITHOUT_SWARM();
  const double matchmaking = 8;
  const std::vector<std::string> common = {
      "swarm.target_batch_size=96", "swarm.matchmaking_s=8", "swarm.averaging_timeout_s=10",
      "train.max_steps=70",         "train.epochs=10",       "train.threads=1",
      "log.progress=plain"};
  std::vector<fs::path> dirs;
  std::vector<std::unique_ptr<Proc>> peers;
  for (int i = 0; i < 3; ++i) {
    dirs.push_back(fresh_dir("swarm-leave" + std::to_string(i)));
    auto extra = common;
    extra.push_back("swarm.min_peers_to_start=3");
    peers.push_back(std::make_unique<Proc>(cohort_argv(peer_args(dirs[i], 70 + i, i ? 70 : 0, extra)), slow_steps()));
  }
  ASSERT_TRUE(wait_for_output(*peers[2], "step 10/")) << peers[2]->output_so_far();
  ::kill(peers[2]->pid(), SIGINT);
  const auto left = peers[2]->wait(60);
  EXPECT_EQ(left.exit_code, 130) << left.output;
  EXPECT_NE(left.output.find("leaving after step"), std::string::npos) << left.output;
  const auto stopped = read_json(dirs[2] / "summary.json");
  EXPECT_EQ(stopped["stopped_by"], "SIGTERM") << "the launcher forwards Ctrl-C to its workers as SIGTERM";
  const int64_t saved_at = stopped["steps"].get<int64_t>();
  EXPECT_GE(saved_at, 10);
  EXPECT_TRUE(fs::exists(dirs[2] / "checkpoints" / "last.safetensors"));
  const auto report = run_cohort({"report", dirs[2].string()}, 60);
  ASSERT_EQ(report.exit_code, 0) << report.output;
  const auto md = read_file(dirs[2] / "report.md");
  EXPECT_NE(md.find("| stopped by | SIGTERM |"), std::string::npos) << md;
  EXPECT_NE(md.find("### Swarm (this peer)"), std::string::npos) << md;
  EXPECT_NE(md.find("| longest round | "), std::string::npos) << md;

  // Back, from its own checkpoint, while the others train on.
  ASSERT_TRUE(wait_for_output(*peers[0], "step " + std::to_string(saved_at + 10) + "/")) << peers[0]->output_so_far();
  auto again = common;
  again.push_back("--resume");
  again.push_back(dirs[2].string());
  auto back = std::make_unique<Proc>(cohort_argv(peer_args(dirs[2], 72, 70, again)), slow_steps());
  const auto rejoined = back->wait(300);
  ASSERT_EQ(rejoined.exit_code, 0) << rejoined.output;
  EXPECT_NE(rejoined.output.find("resuming at step"), std::string::npos) << rejoined.output;
  EXPECT_NE(rejoined.output.find("swarm: caught up to step "), std::string::npos) << rejoined.output;
  for (int i = 0; i < 2; ++i) {
    const auto r = peers[i]->wait(300);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(read_json(dirs[i] / "summary.json")["steps"], 70);
    // No round around the leave waited out the matchmaking period for the peer that left (its record
    // said so at once). (Its return later may: a peer one step behind is waited for.)
    EXPECT_LT(longest_round(dirs[i], saved_at - 1, saved_at + 3), matchmaking / 2) << "peer " << i;
  }
  const auto a = final_weights(dirs[0]);
  EXPECT_EQ(max_difference(a, final_weights(dirs[1])), 0.0);
  EXPECT_EQ(max_difference(a, final_weights(dirs[2])), 0.0);
}

// A newcomer downloads a wider model's state (several 1 MiB chunks); the donor it asks first sends one
// chunk and dies: the newcomer drops it, starts over from the other donor, verifies the digest and trains
// on with the survivor; both end with the same weights.
// After Note [A download lands on the leaders' step] the newcomer ended apart from the survivor in 1 of 2
// runs (its second fetch can wait on the dead donor); Label swarm (CI's `make test-swarm`) since stop 35: 4 passes of 4
// after the fixes of stop 34.
TEST(SwarmLong, ADonorKilledMidTransferIsReplacedByAnother) {
  SKIP_WITHOUT_SWARM();
  const std::vector<std::string> common = {"model.width=32",     "swarm.target_batch_size=64", "swarm.matchmaking_s=3",
                                           "swarm.peer_ttl_s=3", "train.max_steps=80",         "train.threads=1",
                                           "log.progress=plain"};
  std::vector<fs::path> dirs;
  std::vector<std::unique_ptr<Proc>> peers;
  for (int i = 0; i < 3; ++i) {
    dirs.push_back(fresh_dir("swarm-donor" + std::to_string(i)));
    auto extra = common;
    std::map<std::string, std::string> env;
    if (i < 2) extra.push_back("swarm.min_peers_to_start=2");
    // The donor asked first sends one chunk and dies when asked for the next.
    if (i == 1) env = {{"COHORT_FAULT_SWARM_DONOR_CHUNKS", "1"}};
    if (i == 2) env = {{"COHORT_FAULT_SWARM_FIRST_DONOR", address(75)}};
    // The newcomer starts once it sees both donors (else it may ask the one it saw and never meet the fault).
    if (i == 2) extra.push_back("swarm.min_peers_to_start=3");
    if (i == 2) {
      ASSERT_TRUE(wait_for_output(*peers[0], "step 8/")) << peers[0]->output_so_far();
    }
    peers.push_back(
        std::make_unique<Proc>(cohort_argv(peer_args(dirs[i], 74 + i, i ? 74 : 0, extra)), slow_steps(env)));
  }
  const auto newcomer = peers[2]->wait(300);
  ASSERT_EQ(newcomer.exit_code, 0) << newcomer.output;
  EXPECT_NE(newcomer.output.find("dropped for chunk"), std::string::npos) << newcomer.output;
  const auto caught_up = newcomer.output.find("swarm: caught up to step ");
  ASSERT_NE(caught_up, std::string::npos) << newcomer.output;
  const double seconds = number_after(newcomer.output.substr(caught_up), " in ");
  EXPECT_NE(newcomer.output.find("digest verified"), std::string::npos) << newcomer.output;
  EXPECT_GT(seconds, 0);
  const auto survivor = peers[0]->wait(300);
  ASSERT_EQ(survivor.exit_code, 0) << survivor.output;
  EXPECT_NE(peers[1]->wait(30).exit_code, 0) << "the donor that died";
  EXPECT_EQ(max_difference(final_weights(dirs[0]), final_weights(dirs[2])), 0.0);
}

// Four peers started at the same moment, three through the first, find each other quickly (one swarm,
// not two: Hivemind's #624). Then the first, their bootstrap, is killed: the other three train on, and a
// newcomer joins through one of them.
// The newcomer ended apart from every survivor in 1 of 7 runs before the membership fixes of stop 33;
// Label swarm (CI's `make test-swarm`) since stop 35: 4 passes of 4 after the fixes of stop 34.
TEST(SwarmLong, FourPeersFormOneSwarmQuicklyAndOutliveTheirBootstrap) {
  SKIP_WITHOUT_SWARM();
  const std::vector<std::string> common = {"swarm.target_batch_size=96",
                                           "swarm.matchmaking_s=3",
                                           "swarm.averaging_timeout_s=6",
                                           "swarm.peer_ttl_s=3",
                                           "train.max_steps=120",
                                           "train.epochs=10",
                                           "train.threads=1",
                                           "log.progress=plain"};
  // Steps of 250 ms: the survivors must still be training when the newcomer, started on a 2-core machine
  // that runs three peers, has set up and found them (with 100 ms they finished first in 1 of 4 runs).
  auto slower = slow_steps();
  slower["COHORT_FAULT_STEP_DELAY_MS"] = "250";
  std::vector<fs::path> dirs;
  std::vector<std::unique_ptr<Proc>> peers;
  for (int i = 0; i < 4; ++i) {
    dirs.push_back(fresh_dir("swarm-four" + std::to_string(i)));
    auto extra = common;
    extra.push_back("swarm.min_peers_to_start=4");
    peers.push_back(std::make_unique<Proc>(cohort_argv(peer_args(dirs[i], 80 + i, i ? 80 : 0, extra)), slower));
  }
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(wait_for_output(*peers[i], "4 peers in the swarm after ")) << peers[i]->output_so_far();
    // 5 s in the benchmark's terms, with the 3x margin these shared machines need.
    EXPECT_LE(number_after(peers[i]->output_so_far(), "4 peers in the swarm after "), 15.0) << "peer " << i;
  }
  ASSERT_TRUE(wait_for_output(*peers[1], "step 8/")) << peers[1]->output_so_far();
  ::kill(peers[0]->pid(), SIGKILL);
  peers[0]->wait(30);
  ASSERT_TRUE(wait_for_output(*peers[1], "step 16/")) << peers[1]->output_so_far();
  dirs.push_back(fresh_dir("swarm-four4"));
  // It starts once it sees the three survivors, so that it catches up with all of them at once.
  auto newcomer_args = common;
  newcomer_args.push_back("swarm.min_peers_to_start=4");
  Proc newcomer(cohort_argv(peer_args(dirs[4], 84, 82, newcomer_args)), slower);
  const auto joined = newcomer.wait(300);
  ASSERT_EQ(joined.exit_code, 0) << joined.output << "\nthe peer it joined through:\n" << peers[2]->output_so_far();
  EXPECT_NE(joined.output.find("swarm: caught up to step "), std::string::npos) << joined.output;
  for (int i = 1; i < 4; ++i) {
    const auto r = peers[i]->wait(300);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(read_json(dirs[i] / "summary.json")["steps"], 120);
  }
  // The newcomer found survivors and ended averaging with them: its weights are a survivor's.
  // (Not asserted: that every survivor sees the newcomer. One may keep a DHT view without it and
  // average apart: seen in one of three runs; the note of issue 25 says so.)
  EXPECT_GE(read_json(dirs[4] / "summary.json")["swarm_peers_seen"].get<int64_t>(), 2);
  const auto joined_weights = final_weights(dirs[4]);
  double closest = 1e9;
  for (int i = 1; i < 4; ++i) closest = std::min(closest, max_difference(final_weights(dirs[i]), joined_weights));
  EXPECT_EQ(closest, 0.0) << joined.output;
}

// Three "machines" as network namespaces on a bridge in a hub namespace (bench/swarm.py's layout), each
// with its address on 10.81.0.0/24. Needs root and iproute2: why_not() says what is missing.
class Namespaces {
 public:
  explicit Namespaces(int n) : n_(n) {
    if (::geteuid() != 0) {
      why_not_ = "network namespaces need root";
      return;
    }
    teardown();
    bool ok = sh("ip netns add csl-hub") && sh("ip -n csl-hub link add br0 type bridge") &&
              sh("ip -n csl-hub link set br0 up");
    for (int i = 0; ok && i < n; ++i) {
      const auto ns = name(i), v = "csl-v" + std::to_string(i), h = "csl-h" + std::to_string(i);
      ok = sh("ip netns add " + ns) && sh("ip -n " + ns + " link set lo up") &&
           sh("ip link add " + v + " netns " + ns + " type veth peer name " + h + " netns csl-hub") &&
           sh("ip -n " + ns + " addr add " + host(i) + "/24 dev " + v) &&
           sh("ip -n " + ns + " link set " + v + " up") && sh("ip -n csl-hub link set " + h + " master br0") &&
           sh("ip -n csl-hub link set " + h + " up");
    }
    if (!ok) why_not_ = "ip netns / veth / bridge could not be set up (iproute2 and a kernel with netns needed)";
  }
  ~Namespaces() { teardown(); }
  const std::string& why_not() const { return why_not_; }
  static std::string name(int i) { return "csl-" + std::to_string(i); }
  static std::string host(int i) { return "10.81.0." + std::to_string(i + 1); }
  bool link_down(int i) const { return sh("ip -n " + name(i) + " link set csl-v" + std::to_string(i) + " down"); }

 private:
  static bool sh(const std::string& cmd) { return std::system((cmd + " >/dev/null 2>&1").c_str()) == 0; }
  void teardown() const {
    for (int i = 0; i < n_; ++i) sh("ip netns del " + name(i));
    sh("ip netns del csl-hub");
  }
  int n_;
  std::string why_not_;
};

// The child of `parent` (a launcher's worker) once it is stopped (state T), or -1 after `timeout_s`.
pid_t stopped_child(pid_t parent, double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (std::chrono::steady_clock::now() < deadline) {
    for (const auto& entry : fs::directory_iterator("/proc")) {
      std::ifstream stat(entry.path() / "stat");
      std::string pid, comm, state;
      pid_t ppid = 0;
      if (stat >> pid >> comm >> state >> ppid && ppid == parent && state == "T") return std::stoi(pid);
    }
    std::this_thread::sleep_for(50ms);
  }
  return -1;
}

// A peer sends its contributions to round 5 and then its link goes down (it is frozen while the link is
// cut, then let go): the others finish that round within swarm.averaging_timeout_s + 2 s, name it, and
// train on; the cut-off peer goes on alone, each round ending at its deadline.
TEST(SwarmLong, APeerWhoseLinkGoesDownMidRoundIsLeftOut) {
  SKIP_WITHOUT_SWARM();
  Namespaces net(3);
  if (!net.why_not().empty()) GTEST_SKIP() << net.why_not();
  const double timeout = 4;
  std::vector<fs::path> dirs;
  std::vector<std::unique_ptr<Proc>> peers;
  for (int i = 0; i < 3; ++i) {
    dirs.push_back(fresh_dir("swarm-link" + std::to_string(i)));
    std::vector<std::string> extra = {"--nproc-per-node",
                                      "1",
                                      "dist.strategy=swarm",
                                      "swarm.insecure=true",
                                      "swarm.listen=" + Namespaces::host(i) + ":7300",
                                      "swarm.sampler=partition",
                                      "swarm.partitions=3",
                                      "swarm.partition=" + std::to_string(i),
                                      "swarm.min_peers_to_start=3",
                                      "swarm.min_group_size=2",
                                      "swarm.matchmaking_s=5",
                                      "swarm.averaging_timeout_s=" + std::to_string(timeout),
                                      "swarm.peer_ttl_s=3",
                                      "train.max_steps=24",
                                      "train.threads=1",
                                      "log.progress=plain"};
    if (i > 0) extra.push_back("swarm.initial_peers=" + Namespaces::host(0) + ":7300");
    auto argv = cohort_argv(quick_args(dirs[i], extra));
    argv.insert(argv.begin(), {"ip", "netns", "exec", Namespaces::name(i)});
    std::map<std::string, std::string> env;
    if (i == 2) env = {{"COHORT_FAULT_SWARM_ROUND", "5"}, {"COHORT_FAULT_SWARM_SIGNAL", "STOP"}};
    peers.push_back(std::make_unique<Proc>(argv, env));
  }
  const pid_t worker = stopped_child(peers[2]->pid(), 180);
  ASSERT_GT(worker, 0) << peers[2]->output_so_far();
  ASSERT_TRUE(net.link_down(2));
  ::kill(worker, SIGCONT);
  for (int i = 0; i < 2; ++i) {
    const auto r = peers[i]->wait(300);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(read_json(dirs[i] / "summary.json")["steps"], 24);
    EXPECT_NE(r.output.find("swarm: step 6: no result from"), std::string::npos) << r.output;
    for (const auto& rec : read_jsonl(dirs[i] / "metrics.jsonl")) {
      if (rec.value("step", 0) == 6 && rec.contains("swarm_averaging_seconds")) {
        EXPECT_LE(rec["swarm_averaging_seconds"].get<double>(), timeout + 2) << rec.dump();
      }
    }
  }
  // The cut-off peer does not hang either: its rounds end at their deadlines, alone.
  EXPECT_TRUE(wait_for_output(*peers[2], "swarm: step 8: ", 60)) << peers[2]->output_so_far();
  ::kill(-peers[2]->pid(), SIGKILL);
  peers[2]->wait(30);
}

}  // namespace
}  // namespace cohort::testing

// dist.strategy=swarm as users run it: one `cohort train` per peer, each on its own loopback address,
// against plain training and ddp on the same global batch (tests/README: parity), and with a peer killed.
#include <gtest/gtest.h>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <thread>

#include <torch/torch.h>

#include "process/Harness.h"
#include "process/SwarmPeers.h"

namespace cohort::testing {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

TEST(Swarm, OnePeerIsBitwisePlainTraining) {
  SKIP_WITHOUT_SWARM();
  const auto plain = fresh_dir("swarm-plain"), swarm = fresh_dir("swarm-one");
  auto r = cohort_train(quick_args(plain, {"--nproc-per-node", "1", "train.max_steps=8"}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = cohort_train(peer_args(swarm, 2, 0, {"swarm.sampler=partition", "swarm.min_group_size=1", "train.max_steps=8"}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(step_losses(plain, 0), step_losses(swarm, 0));
  EXPECT_EQ(max_difference(final_weights(plain), final_weights(swarm)), 0.0);
  const auto summary = read_json(swarm / "summary.json");
  EXPECT_EQ(summary["strategy"], "swarm");
  EXPECT_EQ(summary["swarm_rounds"], 8);
  EXPECT_EQ(summary["swarm_mean_group_size"], 1);
  EXPECT_TRUE(summary.contains("test_accuracy") && summary.contains("sync_bytes_per_step"));
  // MFU in a swarm peer's summary too (issue 44): its FLOPs per image over its one worker's peak.
  EXPECT_GT(summary["mfu"].get<double>(), 0);
  EXPECT_NEAR(summary["mfu"].get<double>(),
              summary["flops_per_image"].get<double>() * summary["images_per_second"].get<double>() /
                  (summary["peak_tflops_per_worker"].get<double>() * 1e12),
              1e-9);
}

// Four peers, each the shard DistributedSampler gives one of four ranks, one batch per step: the same
// optimizer steps as 4-worker ddp at the same global batch, up to the order of the float sums.
TEST(Swarm, FourPeersOnPartitionsMatchFourWorkerDdp) {
  SKIP_WITHOUT_SWARM();
  const auto ddp = fresh_dir("swarm-ddp4");
  // Four steps: from about the sixth on, this tiny net (resnet8 of width 4, lr rising) turns the last-bit
  // differences of the two summation orders (Gloo's ring, the butterfly's member order) into
  // differences above 1e-5 (measured: losses equal to the bit through step 6, weights 4e-3 apart at 10).
  auto r = cohort_train(quick_args(ddp, {"--nproc-per-node", "4", "train.max_steps=4", "train.threads=1"}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<fs::path> dirs;
  std::vector<std::unique_ptr<Proc>> peers;
  for (int i = 0; i < 4; ++i) {
    dirs.push_back(fresh_dir("swarm-peer" + std::to_string(i)));
    // Every round takes all four (min_group_size 4), and the first waits until all four have started.
    peers.push_back(std::make_unique<Proc>(
        cohort_argv(peer_args(dirs[i], 10 + i, i ? 10 : 0,
                              {"swarm.sampler=partition", "swarm.partitions=4", "swarm.partition=" + std::to_string(i),
                               "swarm.min_peers_to_start=4", "swarm.min_group_size=4", "swarm.matchmaking_s=30",
                               "train.max_steps=4", "train.threads=1", "log.progress=plain"}))));
  }
  std::vector<ProcResult> results;
  for (auto& p : peers) results.push_back(p->wait(300));
  for (auto& res : results) ASSERT_EQ(res.exit_code, 0) << res.output;
  const auto reference = final_weights(ddp);
  const auto first = final_weights(dirs[0]);
  // The butterfly sums in its members' order, the order of their keys, which are new each run: 2 runs of 11
  // (2026-12-07) ended over 1e-5 from ddp at step 4 (2.2e-5 in the one read), the others under it; the
  // peers agree to the bit.
  EXPECT_LE(max_difference(first, reference), 5e-5);
  for (int i = 1; i < 4; ++i) EXPECT_EQ(max_difference(final_weights(dirs[i]), first), 0.0) << "peer " << i;
  const auto summary = read_json(dirs[0] / "summary.json");
  EXPECT_EQ(summary["swarm_mean_group_size"], 4);
  EXPECT_EQ(summary["swarm_failed_rounds"], 0);
  EXPECT_EQ(summary["global_batch"], read_json(ddp / "summary.json")["global_batch"]);
}

// Three peers; the last one sends its contributions to round 5 and then dies (SIGKILL) or freezes
// (SIGSTOP): the others finish that round within swarm.averaging_timeout_s + 2 s, their weights finite,
// the dead peer's contributions in the parts that arrived and their own values in the part it was to
// reduce, and train on to the end; nobody restarts.
void a_peer_fails_mid_round(const std::string& signal, const std::string& name) {
  const double timeout = 4, matchmaking = 5;
  std::vector<fs::path> dirs;
  std::vector<std::unique_ptr<Proc>> peers;
  for (int i = 0; i < 3; ++i) {
    dirs.push_back(fresh_dir(name + std::to_string(i)));
    std::map<std::string, std::string> env;
    if (i == 2) env = {{"COHORT_FAULT_SWARM_ROUND", "5"}, {"COHORT_FAULT_SWARM_SIGNAL", signal}};
    peers.push_back(std::make_unique<Proc>(
        cohort_argv(peer_args(dirs[i], (signal == "KILL" ? 20 : 40) + i, i ? (signal == "KILL" ? 20 : 40) : 0,
                              {"swarm.sampler=partition", "swarm.partitions=3", "swarm.partition=" + std::to_string(i),
                               "swarm.min_peers_to_start=3", "swarm.min_group_size=2",
                               "swarm.matchmaking_s=" + std::to_string(matchmaking),
                               "swarm.averaging_timeout_s=" + std::to_string(timeout), "swarm.peer_ttl_s=3",
                               "train.max_steps=24", "train.threads=1", "log.progress=plain"})),
        env));
    if (i == 0) std::this_thread::sleep_for(300ms);
  }
  for (int i = 0; i < 2; ++i) {
    const auto res = peers[i]->wait(300);
    ASSERT_EQ(res.exit_code, 0) << res.output;
    const auto summary = read_json(dirs[i] / "summary.json");
    EXPECT_EQ(summary["steps"], 24);
    // Still learning: the training loss of the last steps below that of the first (this short run's test
    // accuracy is near chance for plain ddp too, so it is no yardstick here).
    const auto losses = step_losses(dirs[i], 0);
    ASSERT_EQ(losses.size(), 24u);
    EXPECT_LT(losses[21] + losses[22] + losses[23], losses[0] + losses[1] + losses[2]);
    EXPECT_TRUE(std::isfinite(summary["test_accuracy"].get<double>()));
    EXPECT_NE(res.output.find("swarm: step 6: no result from"), std::string::npos) << res.output;
    double logged_longest = 0;
    for (const auto& rec : read_jsonl(dirs[i] / "metrics.jsonl")) {
      if (rec.value("step", 0) == 6 && rec.contains("swarm_round_seconds")) {
        EXPECT_LE(rec["swarm_round_seconds"].get<double>(), timeout + 2) << rec.dump();
      }
      if (rec.contains("swarm_round_seconds"))
        logged_longest = std::max(logged_longest, rec["swarm_round_seconds"].get<double>());
    }
    // The summary's longest round covers the rounds between the logged ones too, and no round (the one
    // the peer died in, and those while its record lived on) took longer than a matchmaking period and
    // an averaging timeout.
    const double longest = summary["swarm_longest_round_seconds"].get<double>();
    EXPECT_GE(longest, logged_longest);
    EXPECT_LE(longest, matchmaking + timeout + 2);
  }
  ::kill(peers[2]->pid(), SIGKILL);
  const auto dead = peers[2]->wait(30);
  EXPECT_NE(dead.exit_code, 0) << "its launcher reports the worker that died";
  // cohort doctor on the three run dirs names the peer from the survivors' records of that round (Note
  // [A swarm peer's rounds in its record]), and its run dir, which has none.
  const auto at = dead.output.find("swarm: peer ");
  ASSERT_NE(at, std::string::npos) << dead.output;
  const auto silent = dead.output.substr(at + 12, 8);
  const auto d = run({COHORT_BINARY, "doctor", dirs[0].string(), dirs[1].string(), dirs[2].string()}, 60.0);
  EXPECT_EQ(d.exit_code, 1) << d.output;
  EXPECT_NE(d.output.find("swarm peer " + silent + " went silent from step 6"), std::string::npos) << d.output;
  EXPECT_NE(d.output.find("run dirs without one: " + dirs[2].string()), std::string::npos) << d.output;
}

TEST(Swarm, APeerKilledMidRoundIsLeftOutAndTheOthersTrainOn) {
  SKIP_WITHOUT_SWARM();
  a_peer_fails_mid_round("KILL", "swarm-kill");
}
TEST(SwarmLong, APeerFrozenMidRoundIsLeftOutAndTheOthersTrainOn) {
  SKIP_WITHOUT_SWARM();
  a_peer_fails_mid_round("STOP", "swarm-stop");
}

// Two peers on 127.0.0.<first_host> and the next, started together; a third, the newcomer, once the first
// has printed `join_after`. All with slow_steps(). Returns the three results, the newcomer last.
std::vector<ProcResult> two_peers_then_a_newcomer(const std::string& name, int first_host,
                                                  const std::vector<std::string>& common, const std::string& join_after,
                                                  std::vector<fs::path>& dirs) {
  std::vector<std::unique_ptr<Proc>> peers;
  for (int i = 0; i < 3; ++i) {
    dirs.push_back(fresh_dir(name + std::to_string(i)));
    auto extra = common;
    if (i < 2) extra.push_back("swarm.min_peers_to_start=2");
    if (i == 2) {
      const auto deadline = std::chrono::steady_clock::now() + 120s;
      while (std::chrono::steady_clock::now() < deadline &&
             peers[0]->output_so_far().find(join_after) == std::string::npos)
        std::this_thread::sleep_for(50ms);
    }
    peers.push_back(std::make_unique<Proc>(cohort_argv(peer_args(dirs[i], first_host + i, i ? first_host : 0, extra)),
                                           slow_steps()));
  }
  std::vector<ProcResult> results;
  for (auto& p : peers) results.push_back(p->wait(300));
  return results;
}

// Two DiLoCo peers, 5 inner steps, int8 on the wire: three outer rounds in 12 steps, the last one closed
// early by the run's last step (Note [A DiLoCo run ends on an outer step]), so both peers end with the
// same weights; they send a small fraction of what ddp's all-reduce would.
TEST(Swarm, DilocoPeersAgreeAfterEachOuterStepAndSendAFractionOfDdpsBytes) {
  SKIP_WITHOUT_SWARM();
  std::vector<fs::path> dirs;
  const auto peers = start_peers(
      "diloco", 2, 50,
      [](int i) -> std::vector<std::string> {
        return {"dist.strategy=diloco",       "diloco.inner_steps=5",   "diloco.compress=int8",
                "swarm.sampler=partition",    "swarm.partitions=2",     "swarm.partition=" + std::to_string(i),
                "swarm.min_peers_to_start=2", "swarm.min_group_size=2", "swarm.matchmaking_s=30",
                "train.max_steps=12",         "train.threads=1"};
      },
      dirs);
  for (auto& p : peers) {
    const auto res = p->wait(300);
    ASSERT_EQ(res.exit_code, 0) << res.output;
  }
  EXPECT_EQ(max_difference(final_weights(dirs[0]), final_weights(dirs[1])), 0.0);
  const auto summary = read_json(dirs[0] / "summary.json");
  EXPECT_EQ(summary["strategy"], "diloco");
  EXPECT_EQ(summary["swarm_rounds"], 3);
  EXPECT_EQ(summary["swarm_mean_group_size"], 2);
  // int8 (about a quarter of fp32) once every 4 or 5 steps: about 1/16 of ddp's bytes or less, with the
  // frames' headers.
  EXPECT_GE(summary["compression_ratio"].get<double>(), 10.0) << summary.dump();
  const auto losses = step_losses(dirs[0], 0);
  ASSERT_EQ(losses.size(), 12u);
  EXPECT_LT(losses[9] + losses[10] + losses[11], losses[0] + losses[1] + losses[2]);
}

// swarm.compress=int8: both peers apply the same averaged gradient (the same bits), and what the wire
// lost of each peer's last contribution is in its checkpoint, so a resumed peer feeds it back.
TEST(Swarm, Int8PeersAgreeAndCheckpointWhatTheWireLost) {
  SKIP_WITHOUT_SWARM();
  std::vector<fs::path> dirs;
  const auto peers = start_peers(
      "swarm-int8", 2, 60,
      [](int i) -> std::vector<std::string> {
        return {"swarm.compress=int8",
                "swarm.sampler=partition",
                "swarm.partitions=2",
                "swarm.partition=" + std::to_string(i),
                "swarm.min_peers_to_start=2",
                "swarm.min_group_size=2",
                "swarm.matchmaking_s=30",
                "train.max_steps=6",
                "train.threads=1"};
      },
      dirs);
  for (auto& p : peers) {
    const auto res = p->wait(300);
    ASSERT_EQ(res.exit_code, 0) << res.output;
  }
  EXPECT_EQ(max_difference(final_weights(dirs[0]), final_weights(dirs[1])), 0.0);
  const auto summary = read_json(dirs[0] / "summary.json");
  EXPECT_EQ(summary["swarm_mean_group_size"], 2);
  EXPECT_EQ(summary["swarm_failed_rounds"], 0);
  for (const auto& dir : dirs) {
    const auto state = checkpoint::load_safetensors(dir / "checkpoints" / "last.state.safetensors").tensors;
    const auto residual = std::find_if(state.begin(), state.end(), [](const auto& named) {
      return named.first.find("swarm.residual") != std::string::npos;
    });
    ASSERT_NE(residual, state.end()) << dir;
    // Not zero (int8 lost something), and under half a step of any block's scale (the largest gradient
    // of this net is well under 127).
    EXPECT_GT(residual->second.abs().max().item<double>(), 0.0);
    EXPECT_LT(residual->second.abs().max().item<double>(), 0.5);
  }
}

// A DiLoCo newcomer joins at an outer step's boundary: it takes a live peer's outer weights, inner
// optimizer state and outer momentum (digest verified), then takes part in the outer averages, so all
// three end on the same outer weights. It failed 1 run in 5 before Note [A peer that caught up says
// where it is] (the newcomer ended an outer round apart from the others); Label swarm (CI's `make test-swarm`) since
// stop 35: 4 passes of 4 after the fixes of stop 34.
TEST(SwarmLong, ADilocoNewcomerJoinsAtAnOuterStepAndEndsWithTheOthersWeights) {
  SKIP_WITHOUT_SWARM();
  const std::vector<std::string> common = {"dist.strategy=diloco",   "diloco.inner_steps=4", "swarm.min_group_size=2",
                                           "swarm.matchmaking_s=10", "train.max_steps=96",   "train.epochs=100",
                                           "train.threads=1",        "log.progress=plain",   "log.every_steps=1"};
  std::vector<fs::path> dirs;
  // The newcomer once the others are in their third outer round.
  const auto results = two_peers_then_a_newcomer("diloco-join", 64, common, "step 9/", dirs);
  for (auto& r : results) ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto& joined = results[2].output;
  const auto at = joined.find("swarm: caught up to step ");
  ASSERT_NE(at, std::string::npos) << joined;
  EXPECT_NE(joined.find("digest verified", at), std::string::npos) << joined;
  // It took the state of an outer step's boundary and started within that round, where the others were
  // (Note [A DiLoCo newcomer starts where the others are]), not at step 0.
  const int64_t round = std::stoll(joined.substr(at + std::string("swarm: caught up to step ").size()));
  // Its first logged step (metrics count from 1), not 96 minus its step count: a newcomer that reaches the
  // round's end after the others closed it steps alone and catches up again, which skips steps.
  const auto losses = losses_by_step(dirs[2]);
  ASSERT_FALSE(losses.empty()) << joined;
  const auto first_step = losses.begin()->first - 1;
  EXPECT_GE(first_step, 4 * round) << joined;
  EXPECT_LT(first_step, 4 * round + 4) << joined;
  EXPECT_GE(round, 1) << joined;
  const auto a = final_weights(dirs[0]);
  EXPECT_EQ(max_difference(a, final_weights(dirs[1])), 0.0) << results[0].output << "\n\n" << results[1].output;
  EXPECT_EQ(max_difference(a, final_weights(dirs[2])), 0.0) << results[0].output << "\n\n" << joined;
  EXPECT_GT(read_json(dirs[0] / "summary.json")["swarm_mean_group_size"].get<double>(), 2.0);
}

// Three DiLoCo peers, one of them slower than the matchmaking window allows (as a peer that evaluates
// alone is): rounds fail, peers step alone, and those whose weights left the majority's download its
// state, round after round. Every download lands on the peer's step or ahead (Note [A peer never goes
// back]) and every peer trains to the end. In bench/swarm.py a peer once took a state two rounds old and
// then failed for want of batches; that came from a donor that had caught up serving its own older
// boundary (fixed in DilocoStrategy::catch_up), which this test did not reproduce before the fix either:
// it holds the invariant, not that donor's case.
TEST(SwarmLong, DilocoPeersThatFallOutOfRoundsCatchUpWithoutGoingBackAndFinish) {
  SKIP_WITHOUT_SWARM();
  std::vector<fs::path> dirs;
  const auto peers = start_peers(
      "diloco-lagging", 3, 90,
      [](int) -> std::vector<std::string> {
        return {"dist.strategy=diloco",   "diloco.inner_steps=4",  "swarm.min_peers_to_start=3",
                "swarm.min_group_size=3", "swarm.matchmaking_s=1", "train.max_steps=40",
                "train.epochs=100",       "train.threads=1",       "log.progress=plain"};
      },
      dirs,
      [](int i) {
        return std::map<std::string, std::string>{{"COHORT_FAULT_STEP_DELAY_MS", i == 0 ? "500" : "20"}};
      });
  int downloads = 0;
  for (auto& p : peers) {
    const auto r = p->wait(300);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(r.output.find("not taken"), std::string::npos) << r.output;
    // "the swarm is at step X, this peer at Y ...: downloading" then "caught up to step Z": Z >= Y.
    const std::string at = "this peer at ", landed = "swarm: caught up to step ";
    for (size_t from = r.output.find(at); from != std::string::npos; from = r.output.find(at, from + 1)) {
      const auto own = std::stoll(r.output.substr(from + at.size()));
      const auto got = r.output.find(landed, from);
      if (got == std::string::npos || got > r.output.find(at, from + 1)) continue;
      ++downloads;
      EXPECT_GE(std::stoll(r.output.substr(got + landed.size())), own) << r.output;
    }
  }
  EXPECT_GT(downloads, 0) << "the slow peer made no peer download: the test did not test anything";
}

// A newcomer started while two peers train: it downloads their state (verified by digest), continues
// from their step, and from then on averages with them: all three end with the same weights.
TEST(Swarm, ANewcomerCatchesUpWithVerifiedStateAndTrainsWithTheOthers) {
  SKIP_WITHOUT_SWARM();
  const std::vector<std::string> common = {"swarm.target_batch_size=64", "swarm.matchmaking_s=3", "train.max_steps=120",
                                           "train.epochs=100",           "train.threads=1",       "log.progress=plain",
                                           "log.every_steps=1"};
  std::vector<fs::path> dirs;
  const auto results = two_peers_then_a_newcomer("swarm-join", 60, common, "step 10/", dirs);
  for (auto& r : results) ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto& joined = results[2].output;
  const auto at = joined.find("swarm: caught up to step ");
  ASSERT_NE(at, std::string::npos) << joined;
  EXPECT_NE(joined.find("digest verified", at), std::string::npos) << joined;
  const auto seconds = std::stod(joined.substr(joined.find(" in ", at) + 4));
  EXPECT_LT(seconds, 15.0);
  // It did not start from step 0: fewer steps of its own than the run's 120.
  EXPECT_LT(step_losses(dirs[2], 0).size(), 115u);
  const auto a = final_weights(dirs[0]);
  EXPECT_EQ(max_difference(a, final_weights(dirs[1])), 0.0) << results[0].output << "\n\n" << results[1].output;
  EXPECT_EQ(max_difference(a, final_weights(dirs[2])), 0.0) << results[0].output << "\n\n" << joined;
}

// Three peers drawing their own batches, a target of one batch each: every global step trains about the
// target (Note [A swarm step is the target batch, not twice it]). Counting only the samples others had
// announced, each peer trained about two batches a step (bench/swarm.py: the swarm's step twice ddp's).
TEST(Swarm, EachGlobalStepTrainsTheTargetBatchNotTwiceIt) {
  SKIP_WITHOUT_SWARM();
  std::vector<fs::path> dirs;
  const auto peers = start_peers(
      "swarm-target", 3, 94,
      [](int) -> std::vector<std::string> {
        return {"swarm.target_batch_size=96", "swarm.min_peers_to_start=3", "swarm.min_group_size=3",
                "swarm.matchmaking_s=5",      "train.max_steps=12",         "train.threads=1"};
      },
      dirs, [](int) { return slow_steps(); });
  double samples = 0;
  for (size_t i = 0; i < peers.size(); ++i) {
    const auto r = peers[i]->wait(300);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto summary = read_json(dirs[i] / "summary.json");
    EXPECT_EQ(summary["swarm_failed_rounds"], 0) << r.output;
    samples += summary["swarm_samples"].get<double>();
  }
  // 12 steps of 96; a peer whose record came late may add a batch now and then, never one a step.
  EXPECT_GE(samples, 12 * 96);
  EXPECT_LE(samples, 12 * 96 * 1.25);
}

// `cohort swarm status` lists the live peers of a running swarm, reached through any one of them.
TEST(Swarm, StatusListsTheLivePeers) {
  SKIP_WITHOUT_SWARM();
  std::vector<std::unique_ptr<Proc>> peers;
  for (int i = 0; i < 2; ++i)
    peers.push_back(std::make_unique<Proc>(
        cohort_argv(peer_args(fresh_dir("swarm-status" + std::to_string(i)), 56 + i, i ? 56 : 0,
                              {"swarm.min_peers_to_start=2", "swarm.matchmaking_s=5", "train.max_steps=100000",
                               "train.epochs=100000", "train.threads=1", "log.progress=plain", "log.every_steps=5"}))));
  const auto deadline = std::chrono::steady_clock::now() + 120s;
  while (std::chrono::steady_clock::now() < deadline &&
         (peers[0]->output_so_far().find("step 5/") == std::string::npos ||
          peers[1]->output_so_far().find("step 5/") == std::string::npos))
    std::this_thread::sleep_for(100ms);
  const auto r = run_cohort({"swarm", "status", "--peers", address(57), "--insecure", "--wait", "3"}, 60);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("2 live peer(s)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(address(56)), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(address(57)), std::string::npos) << r.output;
}

TEST(Swarm, AnExpiredTokenOrNoneIsRefusedAtStart) {
  SKIP_WITHOUT_SWARM();
  const auto dir = fresh_dir("swarm-auth");
  const auto key = dir / "run.key", token = dir / "peer.token";
  ASSERT_EQ(run_cohort({"swarm", "keygen", "--out", key.string()}).exit_code, 0);
  ASSERT_EQ(run_cohort({"swarm", "token", "--key", key.string(), "--ttl", "1s", "--out", token.string()}).exit_code, 0);
  std::this_thread::sleep_for(2100ms);
  auto args = quick_args(dir, {"--nproc-per-node", "1", "dist.strategy=swarm", "swarm.listen=" + address(30),
                               "swarm.token=" + token.string()});
  auto r = cohort_train(args, 120);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("expired"), std::string::npos) << r.output;
  r = cohort_train(quick_args(dir, {"--nproc-per-node", "1", "dist.strategy=swarm", "swarm.listen=" + address(30)}),
                   120);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("cohort swarm keygen"), std::string::npos) << r.output;
}

TEST(Swarm, APeerWaitingForPeersThatNeverComeStopsAtTheTimeoutAndSaysWhatItSaw) {
  SKIP_WITHOUT_SWARM();
  const auto dir = fresh_dir("swarm-start-wait");
  auto r = cohort_train(peer_args(dir, 31, 0, {"swarm.min_peers_to_start=3", "dist.timeout_s=3"}), 120);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("1 of the 3 peers swarm.min_peers_to_start asks for are live after dist.timeout_s = 3 s "
                          "(at most 1 at once; 1 different peers seen)"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("lower swarm.min_peers_to_start"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace cohort::testing

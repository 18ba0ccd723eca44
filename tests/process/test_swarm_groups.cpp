// swarm.group_size: rounds in groups smaller than the swarm, on a grid whose groups change from round to
// round, with the weights averaged in the round's group every swarm.average_state_every steps (Note
// [Groups on a grid] in p2p/Matchmaking.cpp; by default every step: Note [Weights averaged at every step in
// bounded groups] in parallel/swarm/SwarmPeer.cpp).
#include <gtest/gtest.h>

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>
#include <map>
#include <regex>
#include <string>
#include <thread>

#include <torch/torch.h>

#include "process/Harness.h"
#include "process/SwarmPeers.h"

namespace cohort::testing {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

// The relative L2 distance between two peers' trained parameters, all tensors together.
double relative_distance(const checkpoint::NamedTensors& a, const checkpoint::NamedTensors& b) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    const auto x = a[i].second.to(at::kDouble), y = b[i].second.to(at::kDouble);
    diff += (x - y).pow(2).sum().item<double>();
    norm += y.pow(2).sum().item<double>();
  }
  return std::sqrt(diff / norm);
}

// Eight peers in groups of at most four: every round's groups are full or nearly, never larger, the
// groups change (each peer's weights differ from the others' by a little, not by nothing: no group was
// ever everyone), and averaging the weights at every step (the default) keeps them close.
TEST(Swarm, EightPeersAverageInGroupsOfFourThatChangeAndStayClose) {
  SKIP_WITHOUT_SWARM();
  constexpr int kPeers = 8;
  std::vector<fs::path> dirs;
  const auto peers = start_peers(
      "swarm-groups", kPeers, 100,
      [](int i) -> std::vector<std::string> {
        return {"swarm.sampler=partition",    "swarm.partitions=8", "swarm.partition=" + std::to_string(i),
                "swarm.min_peers_to_start=8", "swarm.group_size=4", "swarm.matchmaking_s=2",
                "train.max_steps=30",         "train.epochs=100",   "train.threads=1",
                "log.progress=plain"};
      },
      dirs);
  double group_sum = 0, fewest_state_rounds = 1e9;
  int64_t rounds = 0, timed_state_rounds = 0;
  for (int i = 0; i < kPeers; ++i) {
    const auto r = peers[static_cast<size_t>(i)]->wait(300);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    for (const auto& rec : read_jsonl(dirs[static_cast<size_t>(i)] / "metrics.jsonl")) {
      if (!rec.contains("swarm_group_size")) continue;
      EXPECT_LE(rec["swarm_group_size"].get<double>(), 4) << r.output;
      group_sum += rec["swarm_group_size"].get<double>();
      ++rounds;
      // swarm_state_seconds: the step's averaging of the weights, timed (0 on a step without one).
      if (rec.value("swarm_state_seconds", 0.0) > 0) ++timed_state_rounds;
    }
    const auto summary = read_json(dirs[static_cast<size_t>(i)] / "summary.json");
    // By default at every step of 30 (every 5 steps: 6), but for a step the peer spent alone or whose
    // round went wrong: at least 29 of 30 measured.
    fewest_state_rounds = std::min(fewest_state_rounds, summary["swarm_state_rounds"].get<double>());
    EXPECT_GE(summary["swarm_state_rounds"].get<double>(), 20) << r.output;
  }
  // Measured 3.9 of 4 (five runs): a round or two at the start, while eight processes on two cores come
  // up, can be short.
  EXPECT_GE(group_sum / static_cast<double>(rounds), 0.8 * 4);
  EXPECT_GE(timed_state_rounds, 20 * kPeers) << "the weights' averaging is not timed in metrics.jsonl";
  std::vector<checkpoint::NamedTensors> weights;
  for (const auto& d : dirs) weights.push_back(final_weights(d));
  double closest = 1e9, farthest = 0;
  for (int i = 0; i < kPeers; ++i)
    for (int j = i + 1; j < kPeers; ++j) {
      const double d = relative_distance(weights[static_cast<size_t>(i)], weights[static_cast<size_t>(j)]);
      closest = std::min(closest, d);
      farthest = std::max(farthest, d);
    }
  std::cout << "relative L2 distances between the peers' weights: " << closest << " to " << farthest
            << "; weights averaged in at least " << fewest_state_rounds << " of 30 steps\n";
  // Measured: at most 0.0010 to 0.0012 apart (three runs, weights averaged at every step); 0.0018 to
  // 0.0023 with them averaged every 5 steps; with them never averaged (swarm.average_state_every=1000),
  // 0.007 to 0.014 apart after the same 30 steps.
  EXPECT_LT(farthest, 0.005);
  EXPECT_GT(farthest, 0.0) << "every peer ended with the same weights: the groups were never smaller than the swarm";
}

// swarm.grid=fixed (Note [A grid whose coordinates stay] in parallel/swarm/SwarmGrid.cpp): eight peers in
// groups of four form a 2 x 2 grid at step 2 by their keys' ranks, two a cell, and then keep their
// coordinates: each row and each column holds four (each peer logs its cell). Their rounds stay full, no leader deals
// anyone once every peer's coordinates stay (the deal bytes stop growing), and the rows and columns, each meeting the
// other, keep the weights as close as the dealt grid does.
TEST(Swarm, EightPeersOnAGridWhoseCoordinatesStayNeedNoDealsAndStayClose) {
  SKIP_WITHOUT_SWARM();
  constexpr int kPeers = 8;
  std::vector<fs::path> dirs;
  const auto peers = start_peers(
      "swarm-fixed-grid", kPeers, 140,
      [](int i) -> std::vector<std::string> {
        return {"swarm.sampler=partition",
                "swarm.partitions=8",
                "swarm.partition=" + std::to_string(i),
                "swarm.min_peers_to_start=8",
                "swarm.group_size=4",
                "swarm.grid=fixed",
                "swarm.matchmaking_s=2",
                "train.max_steps=30",
                "train.epochs=100",
                "train.threads=1",
                "log.progress=plain"};
      },
      dirs);
  double group_sum = 0, rounds = 0, deals_late = 0;
  std::map<std::string, int> columns, rows;
  const std::regex cell("coordinates stay at column (\\d+), row (\\d+) of 2 \\(formed\\)");
  for (int i = 0; i < kPeers; ++i) {
    const auto r = peers[static_cast<size_t>(i)]->wait(300);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    std::smatch m;
    ASSERT_TRUE(std::regex_search(r.output, m, cell)) << "peer " << i << " logged no cell of a 2 x 2 grid\n"
                                                      << r.output;
    ++columns[m[1]], ++rows[m[2]];
    double deals_at_10 = -1, deals_at_end = 0;
    for (const auto& rec : read_jsonl(dirs[static_cast<size_t>(i)] / "metrics.jsonl")) {
      if (!rec.contains("swarm_group_size")) continue;
      EXPECT_LE(rec["swarm_group_size"].get<double>(), 4) << r.output;
      group_sum += rec["swarm_group_size"].get<double>();
      ++rounds;
      if (rec["step"].get<int64_t>() == 10) deals_at_10 = rec["swarm_deal_bytes_sent"].get<double>();
      deals_at_end = rec["swarm_deal_bytes_sent"].get<double>();
    }
    ASSERT_GE(deals_at_10, 0) << "no metrics record at step 10";
    deals_late += deals_at_end - deals_at_10;
  }
  EXPECT_EQ(columns, (std::map<std::string, int>{{"0", 4}, {"1", 4}}));
  EXPECT_EQ(rows, (std::map<std::string, int>{{"0", 4}, {"1", 4}}));
  EXPECT_GE(group_sum / rounds, 0.8 * 4);
  EXPECT_EQ(deals_late, 0) << "leaders dealt peers whose coordinates stay, after step 10";
  std::vector<checkpoint::NamedTensors> weights;
  for (const auto& d : dirs) weights.push_back(final_weights(d));
  double farthest = 0;
  for (int i = 0; i < kPeers; ++i)
    for (int j = i + 1; j < kPeers; ++j)
      farthest =
          std::max(farthest, relative_distance(weights[static_cast<size_t>(i)], weights[static_cast<size_t>(j)]));
  std::cout << "mean group " << group_sum / rounds << " of 4; weights at most " << farthest << " apart\n";
  // Measured: 0.0010 to 0.0024 apart and a mean group of 3.93 to 3.98 (three runs); the bound is
  // EightPeersAverageInGroupsOfFourThatChangeAndStayClose's for the dealt grid.
  EXPECT_LT(farthest, 0.005);
  EXPECT_GT(farthest, 0.0) << "every peer ended with the same weights: the groups were never smaller than the swarm";
}

// A peer set to swarm.grid=dealt among peers set to fixed (or a peer of an earlier release): its leaders
// deal the others, so no peer keeps its coordinates while it is live (PeerRecord::kFormsGrid), and each
// fixed peer says once which peer holds the grid back and what to set. The swarm still trains in groups.
TEST(Swarm, AGridDoesNotFormWhileAPeerDealsAndThePeersSayWhich) {
  SKIP_WITHOUT_SWARM();
  constexpr int kPeers = 4;
  std::vector<fs::path> dirs;
  const auto peers = start_peers(
      "swarm-grid-mixed", kPeers, 150,
      [](int i) -> std::vector<std::string> {
        return {"swarm.sampler=partition",
                "swarm.partitions=4",
                "swarm.partition=" + std::to_string(i),
                "swarm.min_peers_to_start=4",
                "swarm.group_size=2",
                std::string("swarm.grid=") + (i == 3 ? "dealt" : "fixed"),
                "swarm.matchmaking_s=2",
                "train.max_steps=10",
                "train.epochs=100",
                "train.threads=1",
                "log.progress=plain"};
      },
      dirs);
  const std::string dealt_peer = address(153);
  double group_sum = 0, rounds = 0;
  for (int i = 0; i < kPeers; ++i) {
    const auto r = peers[static_cast<size_t>(i)]->wait(300);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(r.output.find("coordinates stay"), std::string::npos) << "peer " << i << " kept its coordinates\n"
                                                                    << r.output;
    if (i < 3) {
      EXPECT_NE(r.output.find("at " + dealt_peer + " does not keep them (it runs swarm.grid=dealt"), std::string::npos)
          << "peer " << i << " did not name the dealt peer\n"
          << r.output;
      EXPECT_NE(r.output.find("Set swarm.grid the same on every peer"), std::string::npos) << r.output;
    }
    for (const auto& rec : read_jsonl(dirs[static_cast<size_t>(i)] / "metrics.jsonl")) {
      if (!rec.contains("swarm_group_size")) continue;
      group_sum += rec["swarm_group_size"].get<double>();
      ++rounds;
    }
  }
  ASSERT_GT(rounds, 0);
  EXPECT_GE(group_sum / rounds, 0.8 * 2) << "the dealt grid's groups of 2 did not hold";
}

// Note [An overfull key splits] (p2p/Matchmaking.cpp): four peers in groups of 2 form a 2 x 2 grid (rows
// and columns of 2), and four newcomers double the swarm: with every key whole they settle on the fullest,
// whose leader moves the peers past a group to new keys, and the grid grows in both dimensions. Without
// it the newcomers took the 2 x 2 grid's cells, 4 a row and a column. Where they come apart, a key may end
// one past a group (columns of 3, 3 and 2 in 1 of 3 runs, rows of 3 in 4 of 5 more), which nothing splits:
// its one extra peer would average alone; the whole packing is SwarmGrid.*'s (unit tests).
TEST(Swarm, NewcomersThatDoubleAGridWhoseCoordinatesStaySplitItsKeysBackToGroups) {
  SKIP_WITHOUT_SWARM();
  constexpr int kFirst = 4, kPeers = 8, kSteps = 80;
  const auto settings = [](int i) -> std::vector<std::string> {
    return {"swarm.sampler=partition",
            "swarm.partitions=8",
            "swarm.partition=" + std::to_string(i),
            "swarm.group_size=2",
            "swarm.grid=fixed",
            "swarm.matchmaking_s=2",
            "train.max_steps=" + std::to_string(kSteps),
            "train.epochs=100",
            "train.threads=1",
            "log.progress=plain"};
  };
  std::vector<fs::path> dirs;
  std::vector<std::unique_ptr<Proc>> peers;
  for (int i = 0; i < kPeers; ++i) {
    if (i == kFirst) {  // the newcomers, once the grid formed and the first peers are well into the run
      const auto deadline = std::chrono::steady_clock::now() + 120s;
      while (std::chrono::steady_clock::now() < deadline &&
             peers[0]->output_so_far().find("step 20/") == std::string::npos)
        std::this_thread::sleep_for(50ms);
    }
    dirs.push_back(fresh_dir("swarm-grid-grows" + std::to_string(i)));
    auto extra = settings(i);
    if (i < kFirst) extra.push_back("swarm.min_peers_to_start=4");
    peers.push_back(
        std::make_unique<Proc>(cohort_argv(peer_args(dirs.back(), 154 + i, i ? 154 : 0, extra)), slow_steps()));
  }
  std::map<std::string, int> columns, rows;
  const std::regex cell("coordinates stay at column (\\d+), row (\\d+)");
  int split = 0;
  for (int i = 0; i < kPeers; ++i) {
    const auto r = peers[static_cast<size_t>(i)]->wait(300);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    split += r.output.find("and split: coordinates stay") != std::string::npos;
    std::smatch m, last;
    for (auto it = r.output.cbegin(); std::regex_search(it, r.output.cend(), m, cell); it = m.suffix().first) last = m;
    ASSERT_FALSE(last.empty()) << "peer " << i << " logged no cell\n" << r.output;
    ++columns[last[1]], ++rows[last[2]];
  }
  std::cout << columns.size() << " columns and " << rows.size() << " rows at the end\n";
  EXPECT_GT(split, 0) << "no peer moved: the grid did not grow";
  EXPECT_GT(columns.size(), 2u);
  EXPECT_GT(rows.size(), 2u);
  for (const auto* held : {&columns, &rows})
    for (const auto& [coordinate, n] : *held) EXPECT_LE(n, 3) << "coordinate " << coordinate << " of " << held->size();
}

// Eight peers drawing their own batches in groups of four, a target of three batches a peer: each counts
// only its group key's peers and scales them to the swarm (Note [The target batch counted in the key and
// scaled to the swarm] in parallel/swarm/SwarmPeer.cpp), and every global step still trains about the
// target. Counting its key's peers as the whole swarm, each key would train the whole target (twice it);
// reading the other key's records, which its progress no longer reaches, about one and a half times it.
TEST(Swarm, PeersInGroupsCountTheTargetBatchFromTheirKeyAndStillTrainIt) {
  SKIP_WITHOUT_SWARM();
  constexpr int kPeers = 8, kSteps = 10, kTarget = kPeers * 32 * 3;
  std::vector<fs::path> dirs;
  const auto peers = start_peers(
      "swarm-target-groups", kPeers, 130,
      [](int) -> std::vector<std::string> {
        return {"swarm.target_batch_size=" + std::to_string(kTarget),
                "swarm.min_peers_to_start=8",
                "swarm.group_size=4",
                "swarm.matchmaking_s=2",
                "train.max_steps=" + std::to_string(kSteps),
                "train.epochs=100",
                "train.threads=1"};
      },
      dirs);
  double samples = 0, group_sum = 0;
  for (int i = 0; i < kPeers; ++i) {
    const auto r = peers[static_cast<size_t>(i)]->wait(300);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto summary = read_json(dirs[static_cast<size_t>(i)] / "summary.json");
    samples += summary["swarm_samples"].get<double>();
    group_sum += summary["swarm_mean_group_size"].get<double>();
  }
  std::cout << "samples a global step: " << samples / kSteps << " for a target of " << kTarget << "; mean group "
            << group_sum / kPeers << "\n";
  EXPECT_GE(group_sum / kPeers, 0.8 * 4) << "the peers did not average in groups of four: nothing was tested";
  EXPECT_GE(samples, 0.9 * kSteps * kTarget);
  EXPECT_LE(samples, 1.25 * kSteps * kTarget);
}

// Four peers in groups of two; the last sends its contributions to round 5 and dies (SIGKILL). Its
// partner's gradient round fails, and it leaves its weights to the next step rather than waiting out the
// averaging timeout a second time for the dead member (SwarmPeer::average_state); every other round of a
// group of two averages the weights too (the default, every step). Both show in metrics.jsonl: a step
// whose round failed has no weights' averaging, every other step in a group does.
TEST(SwarmLong, AGroupWhoseRoundWentWrongLeavesItsWeightsToTheNextStep) {
  SKIP_WITHOUT_SWARM();
  constexpr int kPeers = 4;
  const double matchmaking = 2, timeout = 4;
  std::vector<fs::path> dirs;
  const auto peers = start_peers(
      "swarm-groups-fault", kPeers, 120,
      [&](int i) -> std::vector<std::string> {
        return {"swarm.sampler=partition",
                "swarm.partitions=4",
                "swarm.partition=" + std::to_string(i),
                "swarm.min_peers_to_start=4",
                "swarm.group_size=2",
                "swarm.matchmaking_s=" + std::to_string(matchmaking),
                "swarm.averaging_timeout_s=" + std::to_string(timeout),
                "swarm.peer_ttl_s=3",
                "train.max_steps=16",
                "train.epochs=100",
                "train.threads=1",
                "log.every_steps=1",
                "log.progress=plain"};
      },
      dirs,
      [](int i) {
        return i == kPeers - 1 ? std::map<std::string, std::string>{{"COHORT_FAULT_SWARM_ROUND", "5"},
                                                                    {"COHORT_FAULT_SWARM_SIGNAL", "KILL"}}
                               : std::map<std::string, std::string>{};
      });
  int64_t failed_steps = 0, weighed_steps = 0;
  for (int i = 0; i + 1 < kPeers; ++i) {
    const auto r = peers[static_cast<size_t>(i)]->wait(300);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    double failed_before = 0;
    for (const auto& rec : read_jsonl(dirs[static_cast<size_t>(i)] / "metrics.jsonl")) {
      if (!rec.contains("swarm_failed_rounds")) continue;
      const double failed = rec["swarm_failed_rounds"].get<double>(),
                   state_s = rec["swarm_state_seconds"].get<double>();
      if (failed > failed_before) {
        ++failed_steps;
        EXPECT_EQ(state_s, 0.0) << "peer " << i
                                << " averaged the weights after a round that went wrong: " << rec.dump();
        // One averaging timeout at most, not two: the matchmaking bound and the round's timeout.
        EXPECT_LE(rec["swarm_round_seconds"].get<double>() + state_s, 2 * matchmaking + 1 + timeout + 2) << rec.dump();
      } else if (rec["swarm_group_size"].get<double>() > 1) {
        ++weighed_steps;
        EXPECT_GT(state_s, 0.0) << "peer " << i
                                << " in a group, its round whole, did not average the weights: " << rec.dump();
      }
      failed_before = failed;
    }
  }
  std::cout << "steps whose round went wrong: " << failed_steps
            << "; steps in a group that averaged the weights: " << weighed_steps << "\n";
  // The dead peer's partner, at least, lost a round; the others averaged their weights at most steps.
  EXPECT_GE(failed_steps, 1);
  EXPECT_GE(weighed_steps, 20);
  ::kill(peers[kPeers - 1]->pid(), SIGKILL);
  peers[kPeers - 1]->wait(30);
}

// Four DiLoCo peers in groups of two (Note [DiLoCo in bounded groups] in
// parallel/swarm/DilocoStrategy.cpp), their steps slowed to 100 ms so that all four start together: every
// outer round's group holds two (three when three are ready in one key: Note [Groups on a grid]), a peer
// is alone in one round at most (its first, had it come up after the others' round closed: Note [A lone
// peer joins the smallest group]), the groups average their outer state every two rounds and at the
// last, and the peers end close to each other: within one group identical, across groups apart by a
// little.
TEST(Swarm, DilocoPeersAverageInBoundedGroupsAndEndClose) {
  SKIP_WITHOUT_SWARM();
  constexpr int kPeers = 4;
  std::vector<fs::path> dirs;
  const auto peers = start_peers(
      "diloco-groups", kPeers, 110,
      [](int i) -> std::vector<std::string> {
        return {"dist.strategy=diloco",
                "diloco.inner_steps=3",
                "diloco.compress=int8",
                "swarm.sampler=partition",
                "swarm.partitions=4",
                "swarm.partition=" + std::to_string(i),
                "swarm.min_peers_to_start=4",
                "swarm.group_size=2",
                "swarm.average_state_every=2",
                "swarm.matchmaking_s=5",
                "train.max_steps=15",
                "train.epochs=100",
                "train.threads=1"};
      },
      dirs, [](int) { return slow_steps(); });
  for (int i = 0; i < kPeers; ++i) {
    const auto r = peers[static_cast<size_t>(i)]->wait(300);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto summary = read_json(dirs[static_cast<size_t>(i)] / "summary.json");
    // Five outer rounds; a peer that came up after the others' first round downloads their state instead
    // of averaging in it.
    EXPECT_GE(summary["swarm_rounds"].get<double>(), 4) << r.output;
    EXPECT_LE(summary["swarm_rounds"].get<double>(), 5) << r.output;
    // Each round's group, from the windows that follow it.
    std::map<int64_t, int64_t> group_of_round;
    for (const auto& rec : read_jsonl(dirs[static_cast<size_t>(i)] / "metrics.jsonl"))
      if (rec.value("kind", "") == "train" && rec.contains("swarm_rounds") && rec["swarm_rounds"].get<double>() > 0)
        group_of_round[static_cast<int64_t>(rec["swarm_rounds"].get<double>())] =
            static_cast<int64_t>(rec["swarm_group_size"].get<double>());
    int64_t alone = 0;
    for (const auto& [round, size] : group_of_round) {
      EXPECT_LE(size, 3) << "round " << round << "\n" << r.output;
      alone += size == 1;
    }
    // Measured before the lone peer chose its key (the last CI run, and 1 run in 4 here): a peer that came
    // up late stayed alone for three rounds of five (mean group 1.4).
    EXPECT_LE(alone, 1) << r.output;
    EXPECT_GE(summary["swarm_mean_group_size"].get<double>(), 1.6) << r.output;
    // Outer rounds 2 and 4 (every second) and the last, the fifth.
    EXPECT_GE(summary["swarm_state_rounds"].get<double>(), 2) << r.output;
  }
  std::vector<checkpoint::NamedTensors> weights;
  for (const auto& d : dirs) weights.push_back(final_weights(d));
  double farthest = 0;
  int identical_pairs = 0;
  for (int i = 0; i < kPeers; ++i)
    for (int j = i + 1; j < kPeers; ++j) {
      const double d = relative_distance(weights[static_cast<size_t>(i)], weights[static_cast<size_t>(j)]);
      farthest = std::max(farthest, d);
      identical_pairs += d == 0.0;
    }
  std::cout << "farthest relative L2 distance between the DiLoCo peers' weights: " << farthest << ", "
            << identical_pairs << " identical pair(s)\n";
  EXPECT_LT(farthest, 0.02);
  EXPECT_GE(identical_pairs, 1) << "no last group left its peers with the same outer state";
}

}  // namespace
}  // namespace cohort::testing

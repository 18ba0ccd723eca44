// The swarm's matchmaking with real sockets and a real OpenDHT on loopback (SwarmLoopback.h): which ready
// peers form a group, and whom a leader waits for (p2p/Matchmaking.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include <torch/torch.h>

#include "cohort/p2p/Averager.h"
#include "cohort/p2p/Directory.h"
#include "cohort/p2p/Wire.h"
#include "unit/p2p/SwarmLoopback.h"

namespace cohort::p2p {
namespace {

using namespace loopback;

#if COHORT_HAVE_SWARM

// Matchmaking through the DHT: three peers ready for the same step form one group and average.
TEST(SwarmAverager, ReadyPeersFormOneGroupThroughTheDht) {
  Logs logs;
  const auto run = p2p::generate_run_key();
  p2p::DirectoryOptions d;
  d.announce_s = 0.3;
  std::vector<std::unique_ptr<Peer>> peers;
  for (int i = 0; i < 3; ++i)
    peers.push_back(std::make_unique<Peer>(run, 41 + i, i ? peers[0]->transport.address() : "", logs, d));
  for (auto& p : peers) p->directory.announce({{}, p->transport.address(), 3, 0, 0, false, false, 0});
  const auto deadline = p2p::Clock::now() + 10s;
  while (p2p::Clock::now() < deadline)
    if (std::all_of(peers.begin(), peers.end(), [](auto& p) { return p->directory.peers().size() == 2; }))
      break;
    else
      std::this_thread::sleep_for(50ms);
  std::vector<p2p::RoundOutcome> out(3);
  std::vector<std::thread> threads;
  for (int i = 0; i < 3; ++i)
    threads.emplace_back([&, i] {
      p2p::Averager averager(peers[i]->transport, peers[i]->directory, {5.0, 5.0, 3});
      p2p::PeerRecord mine;
      mine.samples = 10;
      out[i] = averager.average(3, torch::full({64}, float(i)), 10, mine);
    });
  for (auto& t : threads) t.join();
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(out[i].group.size(), 3u) << out[i].problem;
    EXPECT_TRUE(torch::allclose(out[i].averaged, torch::full({64}, 1.0f)));
    EXPECT_LT(out[i].matchmaking_s, 4.0);  // everyone was ready: no wait for the deadline
  }
}

// A peer that comes to its group key after another of the key said it was ready, with no heartbeat in
// between, still hears it at once from that peer's matchmaking (Averager::tell_ready), and the two form
// their group without waiting for swarm.matchmaking_s. The latecomer has the smaller key, so it leads.
TEST(SwarmAverager, APeerThatComesToItsGroupKeyLateHearsTheReadyOneAtOnce) {
  Logs logs;
  const auto run = p2p::generate_run_key();
  const auto d = never_in_the_dht();  // the latecomer hears the readiness by message only
  Peer p0(run, 95, "", logs, d), p1(run, 96, p0.transport.address(), logs, d);
  Peer& late = p0.transport.key() < p1.transport.key() ? p0 : p1;
  Peer& early = &late == &p0 ? p1 : p0;
  constexpr uint64_t kKey = 7;
  p2p::PeerRecord on_round{{}, early.transport.address(), 3, 0, 1.0, false, false, 0};
  on_round.group_key = kKey;
  ASSERT_TRUE(meet({{&early, on_round}, {&late, {{}, late.transport.address(), 2, 0, 1.0, false, false, 0}}}));
  const p2p::AveragingOptions options{5.0, 5.0, 2, 8};
  p2p::RoundOutcome out_early, out_late;
  std::thread first([&] {
    p2p::Averager averager(early.transport, early.directory, options);
    p2p::PeerRecord mine;
    mine.samples = 10;
    mine.group_key = kKey;
    out_early = averager.average(3, torch::full({64}, 0.0f), 10, mine);
  });
  std::this_thread::sleep_for(300ms);
  EXPECT_FALSE(late.directory.peers()[0].ready) << "the latecomer, a step behind, heard of the readiness";
  p2p::Averager averager(late.transport, late.directory, options);
  p2p::PeerRecord mine;
  mine.samples = 10;
  mine.group_key = kKey;
  out_late = averager.average(3, torch::full({64}, 2.0f), 10, mine);
  first.join();
  for (const auto* out : {&out_early, &out_late}) {
    EXPECT_EQ(out->group.size(), 2u) << out->problem;
    EXPECT_TRUE(torch::allclose(out->averaged, torch::full({64}, 1.0f)));
  }
  EXPECT_LT(out_late.matchmaking_s, 2.0) << "the latecomer waited for swarm.matchmaking_s";
}

// Note [A starting peer names no group key]: the leader and another peer of key 7 are ready for the first
// round while a third still starts (its record: step 0, key 0, not ready, as SwarmPeer announces before
// its first batch). The leader waits for it, and the round holds all three.
TEST(SwarmAverager, ALeaderWaitsForAPeerThatStillStartsAndNamesNoGroupKey) {
  Logs logs;
  const auto run = p2p::generate_run_key();
  const auto d = no_heartbeat_within_a_test();  // they meet through the DHT
  std::vector<std::unique_ptr<Peer>> peers;
  for (int i = 0; i < 3; ++i)
    peers.push_back(std::make_unique<Peer>(run, 97 + i, i ? peers[0]->transport.address() : "", logs, d));
  // The one starting late is not the leader (the smallest key leads).
  std::sort(peers.begin(), peers.end(),
            [](const auto& a, const auto& b) { return a->transport.key() < b->transport.key(); });
  Peer& starting = *peers[2];
  constexpr uint64_t kKey = 7;
  const auto record = [](Peer& p, uint64_t key) {
    p2p::PeerRecord r{{}, p.transport.address(), 0, 0, 1.0, false, false, 0};
    r.group_key = key;
    return r;
  };
  ASSERT_TRUE(meet({{peers[0].get(), record(*peers[0], kKey)},
                    {peers[1].get(), record(*peers[1], kKey)},
                    {&starting, record(starting, 0)}}));
  const p2p::AveragingOptions options{5.0, 5.0, 2, 8};
  std::vector<p2p::RoundOutcome> out(3);
  const auto average = [&](size_t i) {
    p2p::Averager averager(peers[i]->transport, peers[i]->directory, options);
    p2p::PeerRecord mine;
    mine.samples = 10;
    mine.group_key = kKey;
    out[i] = averager.average(0, torch::full({64}, float(i)), 10, mine);
  };
  std::thread first([&] { average(0); }), second([&] { average(1); });
  std::this_thread::sleep_for(500ms);  // its first batch
  average(2);
  first.join();
  second.join();
  for (const auto& o : out) {
    EXPECT_EQ(o.group.size(), 3u) << o.problem;
    EXPECT_TRUE(torch::allclose(o.averaged, torch::full({64}, 1.0f)));
  }
}

// Note [A leader deals its groups over the next round's keys]: two peers a step behind average their round
// in groups of 2, and their leader tells the two peers of the next step where it dealt them: to keys the
// next step's leader does not have. That leader then closes its group at once, where it waited out
// swarm.matchmaking_s for every peer a step behind (they might have come to its key).
TEST(SwarmAverager, ALeaderDoesNotWaitForPeersTheLastRoundDealtAnotherKey) {
  Logs logs;
  const auto run = p2p::generate_run_key();
  const auto d = no_heartbeat_within_a_test();  // they meet through the DHT; no beat moves a record on
  std::vector<std::unique_ptr<Peer>> peers;
  for (int i = 0; i < 4; ++i)
    peers.push_back(std::make_unique<Peer>(run, 150 + i, i ? peers[0]->transport.address() : "", logs, d));
  Peer &behind0 = *peers[0], &behind1 = *peers[1], &leader = *peers[2], &member = *peers[3];
  const uint64_t behind_key = 1 + 4;                      // step 2: dimension 0
  const uint64_t next_key = 1 + (uint64_t{1} << 32) + 7;  // step 3: dimension 1, a coordinate nobody is dealt
  const auto record = [](Peer& p, int64_t step, uint64_t key) {
    p2p::PeerRecord r{{}, p.transport.address(), step, 0, 1.0, false, false, 0};
    r.group_key = key;
    return r;
  };
  ASSERT_TRUE(meet({{&behind0, record(behind0, 2, behind_key)},
                    {&behind1, record(behind1, 2, behind_key)},
                    {&leader, record(leader, 3, next_key)},
                    {&member, record(member, 3, next_key)}}));
  const p2p::AveragingOptions options{5.0, 5.0, 2, 2};
  const auto average = [&](Peer& p, uint64_t step, uint64_t key, float value) {
    p2p::Averager averager(p.transport, p.directory, options);
    p2p::PeerRecord mine;
    mine.samples = 10;
    mine.group_key = key;
    return averager.average(step, torch::full({64}, value), 10, mine);
  };
  p2p::RoundOutcome round_behind[2];
  std::thread t0([&] { round_behind[0] = average(behind0, 2, behind_key, 0); });
  round_behind[1] = average(behind1, 2, behind_key, 2);
  t0.join();
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(round_behind[i].group.size(), 2u) << round_behind[i].problem;
    EXPECT_EQ(round_behind[i].keys, p2p::grid_keys(4, 2)) << "the leader's key count, sent with the group";
    // Note [The target batch counted in the key and scaled to the swarm] in parallel/swarm/SwarmProgress.cpp
    EXPECT_EQ(round_behind[i].swarm, 4) << "the live peers the leader knows, sent with the group";
  }
  // The deal reached both peers of the next step, with the keys the members themselves take.
  for (Peer* p : {&leader, &member})
    for (int i = 0; i < 2; ++i) {
      const auto key = peers[static_cast<size_t>(i)]->transport.key();
      const auto view = [&] {
        const auto seen = p->directory.peers();
        const auto it = std::find_if(seen.begin(), seen.end(), [&](const p2p::PeerRecord& r) { return r.key == key; });
        return it == seen.end() ? p2p::PeerRecord{} : *it;
      };
      const auto deadline = p2p::Clock::now() + 10s;
      while (view().dealt_step != 3 && p2p::Clock::now() < deadline) std::this_thread::sleep_for(20ms);
      EXPECT_EQ(view().step, 2) << "its record is still a step behind";
      EXPECT_EQ(view().dealt_step, 3);
      EXPECT_EQ(view().dealt_key, p2p::next_group_key(behind_key, 2, round_behind[i].place, round_behind[i].keys));
    }
  p2p::RoundOutcome next[2];
  std::thread t1([&] { next[0] = average(member, 3, next_key, 4); });
  next[1] = average(leader, 3, next_key, 6);
  t1.join();
  for (const auto& o : next) {
    EXPECT_EQ(o.group.size(), 2u) << o.problem;
    EXPECT_TRUE(torch::allclose(o.averaged, torch::full({64}, 5.0f)));
    EXPECT_LT(o.matchmaking_s, 2.5) << "a leader waited for the peers dealt elsewhere";
  }
}

// Note [The target batch counted in the key and scaled to the swarm] in parallel/swarm/SwarmProgress.cpp: a
// member reads the swarm's size from its leader's group message, and reads 0 (it counts its own records)
// from a leader of an earlier release, whose message ends before it, or from a size past any swarm's.
TEST(SwarmAverager, AMemberReadsTheSwarmsSizeFromItsLeaderOrNoneFromAnOlderOneOrAnImpossibleOne) {
  Logs logs;
  const auto run = p2p::generate_run_key();
  Peer leader(run, 185, "", logs), member(run, 186, leader.transport.address(), logs);
  const auto group = sorted({leader.member(), member.member()});
  const std::vector<std::optional<uint64_t>> sizes{64, std::nullopt, kMaxSwarm + 1};
  for (size_t round = 0; round < sizes.size(); ++round) {
    Writer w;
    w.u64(group.size());
    for (const auto& m : group) w.raw(m.key.data(), m.key.size()).str(m.address);
    w.u64(0);                                       // the first member's place
    if (sizes[round]) w.u64(2).u64(*sizes[round]);  // the key count, then the swarm's size
    leader.transport.send(member.transport.key(), member.transport.address(), {MessageKind::kGroup, round, 0},
                          w.take());
    RoundOutcome out;
    std::thread t([&] {
      Averager averager(member.transport, member.directory, {5.0, 5.0, 2});
      PeerRecord mine;
      mine.samples = 10;
      out = averager.average(round, torch::full({16}, 1.0f), 10, mine);
    });
    Averager(leader.transport, leader.directory, {5.0, 5.0, 2}).all_reduce(round, group, torch::full({16}, 3.0f), 10);
    t.join();
    ASSERT_EQ(out.group.size(), 2u) << out.problem;
    EXPECT_TRUE(torch::allclose(out.averaged, torch::full({16}, 2.0f)));
    EXPECT_EQ(out.swarm, round == 0 ? 64 : 0) << "round " << round;
    EXPECT_EQ(out.keys, sizes[round] ? 2 : 0) << "round " << round;
    EXPECT_EQ(out.moved, -1) << "a message that moves nobody, or ends before it says so";
  }
}

// Note [An overfull key splits]: four peers whose coordinates stay, all on column 0, ready on their key in
// groups of 2. Their leader keeps two on it and moves the other two to column 1 (the keys it sees along
// the dimension: 1), member by member in the group messages, whichever groups they average in.
TEST(SwarmAverager, ALeaderWhoseKeyHoldsMoreThanAGroupMovesThePeersPastAGroupToANewKey) {
  Logs logs;
  const auto run = p2p::generate_run_key();
  const auto d = no_heartbeat_within_a_test();
  std::vector<std::unique_ptr<Peer>> peers;
  for (int i = 0; i < 4; ++i)
    peers.push_back(std::make_unique<Peer>(run, 243 + i, i ? peers[0]->transport.address() : "", logs, d));
  constexpr int64_t kRound = 3;  // dimension 1: the key is the column, c0
  const auto record = [](Peer& p, uint64_t row) {
    p2p::PeerRecord r{{}, p.transport.address(), kRound, 0, 1.0, false, false, 0};
    r.grid = grid_word(0, row);
    r.group_key = fixed_key_at(r, kRound);
    return r;
  };
  std::vector<std::pair<Peer*, PeerRecord>> meeting;
  for (size_t i = 0; i < peers.size(); ++i) meeting.push_back({peers[i].get(), record(*peers[i], i)});
  ASSERT_TRUE(meet(meeting));
  std::vector<RoundOutcome> out(peers.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < peers.size(); ++i)
    threads.emplace_back([&, i] {
      Averager averager(peers[i]->transport, peers[i]->directory, {5.0, 5.0, 2, 2});
      auto mine = record(*peers[i], i);
      mine.samples = 10;
      out[i] = averager.average(kRound, torch::full({64}, float(i)), 10, mine);
    });
  for (auto& t : threads) t.join();
  std::map<int64_t, int> moved;
  for (const auto& o : out) {
    EXPECT_EQ(o.group.size(), 2u) << o.problem;
    ++moved[o.moved];
  }
  EXPECT_EQ(moved, (std::map<int64_t, int>{{-1, 2}, {1, 2}})) << "two stay, two move to column 0 + 1";
}

// Note [A leader deals its groups over the next round's keys]: a deal shows on the member's record until
// its own record gets to the dealt step, and two leaders that dealt it different keys for one step (it was
// in two groups and kept one) leave it as its record says, so that every leader waits for it.
TEST(SwarmDirectory, ADealShowsUntilTheRecordGetsThereAndTwoDifferentDealsShowNone) {
  Logs logs;
  const auto run = p2p::generate_run_key();
  const auto d = never_in_the_dht();
  Peer a(run, 154, "", logs, d), b(run, 155, a.transport.address(), logs, d);
  const auto record = [](Peer& p, int64_t step) {
    p2p::PeerRecord r{{}, p.transport.address(), step, 0, 1.0, false, false, 0};
    r.group_key = 5;
    return r;
  };
  ASSERT_TRUE(meet({{&a, record(a, 2)}, {&b, record(b, 2)}}));
  const auto seen = [&] { return a.directory.peers().at(0); };
  const uint64_t x = 1 + (uint64_t{1} << 32), y = x + 1;
  a.directory.take_deal(3, {{b.transport.key(), x}});
  EXPECT_EQ(seen().dealt_step, 3);
  EXPECT_EQ(seen().dealt_key, x);
  EXPECT_EQ(p2p::as_dealt(seen()).step, 3);
  EXPECT_EQ(p2p::as_dealt(seen()).group_key, x);
  EXPECT_FALSE(p2p::as_dealt(seen()).ready);
  a.directory.take_deal(3, {{b.transport.key(), x}});  // the same deal again changes nothing
  EXPECT_EQ(seen().dealt_key, x);
  a.directory.take_deal(4, {{b.transport.key(), x}});
  a.directory.take_deal(3, {{b.transport.key(), y}});  // a late deal of an earlier round
  EXPECT_EQ(seen().dealt_step, 4);
  EXPECT_EQ(seen().dealt_key, x);
  a.directory.take_deal(4, {{b.transport.key(), y}});
  EXPECT_EQ(seen().dealt_step, -1) << "two leaders dealt it different keys";
  EXPECT_EQ(p2p::as_dealt(seen()).step, 2);
  a.directory.take_deal(5, {{b.transport.key(), y}});
  EXPECT_EQ(seen().dealt_step, 5);
  auto there = record(b, 5);
  there.group_key = y;
  b.directory.announce(there);
  const auto deadline = p2p::Clock::now() + 10s;
  while (seen().step != 5 && p2p::Clock::now() < deadline) std::this_thread::sleep_for(20ms);
  ASSERT_EQ(seen().step, 5);
  EXPECT_EQ(seen().dealt_step, -1) << "its own record is there: the deal is dropped";
  EXPECT_EQ(p2p::as_dealt(seen()).group_key, y);
}

#endif  // COHORT_HAVE_SWARM

}  // namespace
}  // namespace cohort::p2p

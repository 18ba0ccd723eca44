// The swarm's directory with real sockets and a real OpenDHT on loopback (SwarmLoopback.h): how peers
// find each other, and which record changes reach which peers.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <optional>
#include <thread>

#include "cohort/p2p/Directory.h"
#include "unit/p2p/SwarmLoopback.h"

namespace cohort::p2p {
namespace {

using namespace loopback;

#if COHORT_HAVE_SWARM

TEST(SwarmDirectory, PeersFindEachOtherAndRecordsOfAnotherRunAreRefused) {
  Logs logs;
  const auto run = p2p::generate_run_key();
  // A peer that knows others reads the intruder's bucket of the DHT one read in 16 (Note [The run's
  // records in sixteen buckets]): reads every 0.25 s reach it within the test's time.
  p2p::DirectoryOptions d;
  d.dht_read_known_s = 0.25;
  Peer a(run, 11, "", logs, d), b(run, 12, a.transport.address(), logs, d), c(run, 13, b.transport.address(), logs, d);
  // The intruder writes under this run's DHT key, its records sealed with another run's token.
  Logs intruder_logs;
  const auto stranger = p2p::issue_token(p2p::generate_run_key(), 1h, now_unix());
  Peer intruder(run, stranger, 14, a.transport.address(), intruder_logs, {});
  for (auto* p : {&a, &b, &c}) p->directory.announce({{}, p->transport.address(), 5, 10, 1.0, false, false, 0});
  intruder.directory.announce({{}, intruder.transport.address(), 5, 10, 1.0, false, false, 0});
  const auto deadline = p2p::Clock::now() + 10s;
  while (p2p::Clock::now() < deadline && c.directory.peers().size() < 2) std::this_thread::sleep_for(50ms);
  const auto seen = c.directory.peers();
  ASSERT_EQ(seen.size(), 2u);
  for (const auto& p : seen) {
    EXPECT_EQ(p.step, 5);
    EXPECT_TRUE(p.key == a.transport.key() || p.key == b.transport.key());
  }
  const std::string refusal = "refused a record from peer " + p2p::peer_name(stranger.token.peer_public_key);
  while (p2p::Clock::now() < deadline + 5s && !logs.contains(refusal)) std::this_thread::sleep_for(50ms);
  EXPECT_TRUE(logs.contains(refusal));
}

// Note [Records go to the peers directly]: once peers know each other, a change of a record reaches them
// without the DHT. Here the DHT holds only the first records (the next put is 100 s away), so a peer
// that sees the second step got it directly.
TEST(SwarmDirectory, ARecordChangeGoesToTheKnownPeersDirectly) {
  Logs logs;
  const auto run = p2p::generate_run_key();
  p2p::DirectoryOptions d;
  d.dht_put_s = 100;
  d.dht_read_s = 0.2;
  Peer a(run, 15, "", logs, d), b(run, 16, a.transport.address(), logs, d);
  for (auto* p : {&a, &b}) p->directory.announce({{}, p->transport.address(), 5, 10, 1.0, false, false, 0});
  const auto deadline = p2p::Clock::now() + 10s;
  const auto sees = [&](Peer& p, int64_t step) {
    const auto peers = p.directory.peers();
    return peers.size() == 1 && peers[0].step == step;
  };
  while (p2p::Clock::now() < deadline && !(sees(a, 5) && sees(b, 5))) std::this_thread::sleep_for(20ms);
  ASSERT_TRUE(sees(a, 5) && sees(b, 5));
  const double before = p2p::detail::unix_now();
  a.directory.announce({{}, a.transport.address(), 6, 0, 1.0, true, false, 0});
  while (p2p::Clock::now() < deadline && !sees(b, 6)) std::this_thread::sleep_for(20ms);
  ASSERT_TRUE(sees(b, 6));
  EXPECT_TRUE(b.directory.peers()[0].ready);
  // When b took it in, by b's clock (Note [Samples trained since the record] in parallel/swarm/SwarmProgress.cpp).
  EXPECT_GE(b.directory.peers()[0].taken_unix, before);
  EXPECT_LE(b.directory.peers()[0].taken_unix, p2p::detail::unix_now());
  EXPECT_GT(a.transport.stats().record_bytes_sent, 0);
  // Each record said its peer reads frames sealed for it alone: the direct ones went with a MAC.
  EXPECT_GT(a.transport.stats().frames_with_mac, 0);
  // A peer that leaves is out of the others' view at once, not when its record expires.
  a.directory.announce({{}, a.transport.address(), 6, 0, 1.0, false, true, 0});
  while (p2p::Clock::now() < deadline && !b.directory.peers().empty()) std::this_thread::sleep_for(20ms);
  EXPECT_TRUE(b.directory.peers().empty());
}

// Note [A peer that knows nobody knocks] and Note [The heartbeat is its own clock]: three peers whose
// records change every 50 ms (faster than announce_s, as a swarm's steps do), a DHT that is put once and
// read again only after 100 s, and a newcomer that comes when the DHT's copies are older than the TTL: it
// knocks on its initial peer and, through that peer's heartbeat, meets all three.
TEST(SwarmDirectory, ANewcomerKnockingOnOnePeerMeetsEveryPeerThroughItsHeartbeat) {
  Logs logs;
  const auto run = p2p::generate_run_key();
  p2p::DirectoryOptions d;
  d.dht_put_s = 100;
  d.dht_read_s = d.dht_read_known_s = 100;
  d.record_ttl_s = 2;
  std::vector<std::unique_ptr<Peer>> peers;
  for (int i = 0; i < 3; ++i)
    peers.push_back(std::make_unique<Peer>(run, 61 + i, i ? peers[size_t(i) - 1]->transport.address() : "", logs, d));
  std::atomic<bool> stop{false};
  std::thread steps([&] {
    for (int64_t step = 1; !stop; ++step) {
      for (auto& p : peers) p->directory.announce({{}, p->transport.address(), step, 0, 1.0, false, false, 0});
      std::this_thread::sleep_for(50ms);
    }
  });
  std::this_thread::sleep_for(3s);  // the DHT's copies are now past the TTL
  Peer newcomer(run, 64, peers[2]->transport.address(), logs, d);
  newcomer.directory.announce({{}, newcomer.transport.address(), 0, 0, 1.0, false, false, 0});
  const auto deadline = p2p::Clock::now() + 5s;
  while (p2p::Clock::now() < deadline && newcomer.directory.peers().size() < 3) std::this_thread::sleep_for(20ms);
  const auto seen = newcomer.directory.peers().size();
  stop = true;
  steps.join();
  EXPECT_EQ(seen, 3u);
}

// Note [A peer whose record expired still hears the heartbeat]: B falls silent for longer than the TTL
// (its heartbeat is 100 s away), so A's and C's records of it expire. Before, they then stopped sending
// to B (each still knows a live peer, so neither knocks), B's records of them expired in turn, and B's
// next change went to nobody: B never met them again without the DHT (read here only every 100 s). Now
// their heartbeats still reach B, so B still knows them, and B's next step reaches them at once. (B also
// answers those heartbeats, addressed to nobody, with its record: Note [A heartbeat to nobody is
// answered]; so A may see B again before B's step.)
TEST(SwarmDirectory, APeerWhoseRecordExpiredMeetsTheOthersAgainAtItsNextChange) {
  Logs logs;
  const auto run = p2p::generate_run_key();
  p2p::DirectoryOptions d;
  d.announce_s = 0.2;
  d.record_ttl_s = 1;
  d.dht_put_s = d.dht_read_s = d.dht_read_known_s = 100;
  p2p::DirectoryOptions silent = d;
  silent.announce_s = 100;
  Peer a(run, 81, "", logs, d), c(run, 83, a.transport.address(), logs, d);
  Peer b(run, 82, a.transport.address(), logs, silent);
  for (auto* p : {&a, &b, &c}) p->directory.announce({{}, p->transport.address(), 1, 0, 1.0, false, false, 0});
  const auto step_of = [](Peer& viewer, const Peer& seen) {
    for (const auto& r : viewer.directory.peers())
      if (r.key == seen.transport.key()) return r.step;
    return int64_t{-1};
  };
  auto deadline = p2p::Clock::now() + 10s;
  while (p2p::Clock::now() < deadline && !(step_of(a, b) == 1 && step_of(b, a) == 1 && step_of(b, c) == 1))
    std::this_thread::sleep_for(20ms);
  ASSERT_TRUE(step_of(a, b) == 1 && step_of(b, a) == 1 && step_of(b, c) == 1);
  std::this_thread::sleep_for(2500ms);  // B's own heartbeat sent nothing since: its first record expired
  EXPECT_EQ(step_of(a, c), 1);
  EXPECT_EQ(step_of(b, a), 1) << "A's heartbeat no longer reaches B";
  b.directory.announce({{}, b.transport.address(), 2, 0, 1.0, false, false, 0});
  deadline = p2p::Clock::now() + 3s;
  while (p2p::Clock::now() < deadline && !(step_of(a, b) == 2 && step_of(c, b) == 2)) std::this_thread::sleep_for(20ms);
  EXPECT_EQ(step_of(a, b), 2);
  EXPECT_EQ(step_of(c, b), 2);
}

// Note [Readiness goes to the group] (p2p/DirectorySend.cpp): with group keys, a peer's readiness reaches the
// peers of its key at once and the others only with the heartbeat (none comes within the test: announce_s
// is 30 s), while a change of step still reaches everyone; with key 0 (no swarm.group_size) readiness
// reaches everyone as before.
TEST(SwarmDirectory, ReadinessGoesToThePeersOfItsGroupKeyAndAStepToEveryone) {
  Logs logs;
  const auto run = p2p::generate_run_key();
  const auto d = no_heartbeat_within_a_test();
  // a's record never goes into the DHT, which c reads (b and c meet there): c hears a's changes by message only.
  Peer a(run, 91, "", logs, never_in_the_dht()), b(run, 92, a.transport.address(), logs, d),
      c(run, 93, a.transport.address(), logs, d);
  const auto record = [](Peer& p, int64_t step, bool ready, uint64_t group_key) {
    p2p::PeerRecord r{{}, p.transport.address(), step, 0, 1.0, ready, false, 0};
    r.group_key = group_key;
    return r;
  };
  ASSERT_TRUE(meet({{&a, record(a, 5, false, 1)}, {&b, record(b, 5, false, 1)}, {&c, record(c, 5, false, 2)}}));
  // What `p` holds of a's record.
  const auto of_a = [&](Peer& p) {
    for (const auto& r : p.directory.peers())
      if (r.key == a.transport.key()) return std::optional<p2p::PeerRecord>(r);
    return std::optional<p2p::PeerRecord>();
  };
  const auto deadline = p2p::Clock::now() + 10s;
  const auto wait_for = [&](const std::function<bool()>& done) {
    while (p2p::Clock::now() < deadline && !done()) std::this_thread::sleep_for(20ms);
    return done();
  };
  a.directory.announce(record(a, 5, true, 1), p2p::Directory::Reach::kGroup);
  ASSERT_TRUE(wait_for([&] { return of_a(b) && of_a(b)->ready; })) << "b, of a's key, did not hear a was ready";
  std::this_thread::sleep_for(300ms);
  ASSERT_TRUE(of_a(c));
  EXPECT_FALSE(of_a(c)->ready) << "c, of another key, heard of a's readiness before a heartbeat";
  // A step, asked for the group only, still goes to everyone: a leader waits for a peer a step behind.
  a.directory.announce(record(a, 6, false, 1), p2p::Directory::Reach::kGroup);
  ASSERT_TRUE(wait_for([&] { return of_a(c) && of_a(c)->step == 6; })) << "c did not hear a's step";
  // A digest of the weights goes to everyone: any peer compares them.
  a.directory.announce_digest(6, 42);
  ASSERT_TRUE(wait_for([&] { return of_a(c) && of_a(c)->digest_step == 6; })) << "c did not hear a's digest";
  // Without group keys readiness goes to everyone.
  a.directory.announce(record(a, 6, false, 0));
  ASSERT_TRUE(wait_for([&] { return of_a(c) && of_a(c)->group_key == 0; }));
  a.directory.announce(record(a, 6, true, 0), p2p::Directory::Reach::kGroup);
  EXPECT_TRUE(wait_for([&] { return of_a(c) && of_a(c)->ready; })) << "c did not hear a was ready, key 0";
}

// Whether every other peer holds `who`'s record live, and `who` holds all of theirs: what the heartbeat
// tests watch while they change what `who` sends.
bool everyone_sees(const std::vector<std::unique_ptr<Peer>>& peers, const Peer& who) {
  for (const auto& p : peers) {
    if (p.get() == &who) continue;
    const auto seen = p->directory.peers();
    if (std::none_of(seen.begin(), seen.end(), [&](const auto& r) { return r.key == who.transport.key(); }))
      return false;
  }
  return who.directory.peers().size() == peers.size() - 1;
}

// Whether every peer still sees `who` at each of `checks` looks, 200 ms apart.
bool seen_throughout(const std::vector<std::unique_ptr<Peer>>& peers, const Peer& who, int checks) {
  bool seen = true;
  for (int i = 0; i < checks; ++i) {
    std::this_thread::sleep_for(200ms);
    seen = seen && everyone_sees(peers, who);
  }
  return seen;
}

// Six peers on hosts `first_host` to `first_host` + 5, with the default heartbeat (announce_s 1,
// record_ttl_s 4), each on step 0, returned once every one sees peers[0] and the others, and past
// kWelcomeBeats, after which a heartbeat passes records on to 2 peers only. Empty if they did not meet
// within 10 s.
std::vector<std::unique_ptr<Peer>> six_peers_past_their_welcome(const p2p::RunKey& run, int first_host, Logs& logs) {
  p2p::DirectoryOptions d;
  d.dht_put_s = 100;
  d.dht_read_known_s = 100;
  std::vector<std::unique_ptr<Peer>> peers;
  for (int i = 0; i < 6; ++i)
    peers.push_back(std::make_unique<Peer>(run, first_host + i, i ? peers[0]->transport.address() : "", logs, d));
  for (auto& p : peers) p->directory.announce(p2p::PeerRecord{{}, p->transport.address(), 0, 0, 1.0});
  const auto deadline = p2p::Clock::now() + 10s;
  while (p2p::Clock::now() < deadline && !everyone_sees(peers, *peers[0])) std::this_thread::sleep_for(50ms);
  if (!everyone_sees(peers, *peers[0])) return {};
  std::this_thread::sleep_for(3500ms);
  return peers;
}

// Note [A heartbeat skips the peers that heard this one lately]: a peer whose steps (each sent to every
// live peer) come every 0.3 s, faster than announce_s, sends its heartbeat only to the peers it passes
// records on to (kGossipFanout of them, once the others were met more than three beats ago). Every other
// peer still holds its record live throughout, and again once it stops stepping and the heartbeat alone
// keeps it live.
TEST(SwarmDirectory, AHeartbeatSkipsThePeersThatHeardAStepLately) {
  Logs logs;
  const auto run = p2p::generate_run_key();
  // announce_s 1, record_ttl_s 4: a heartbeat skips peers sent a record within 1 s
  auto peers = six_peers_past_their_welcome(run, 141, logs);
  ASSERT_EQ(peers.size(), 6u) << "the peers did not meet";
  Peer& stepper = *peers[0];
  const auto record = [](Peer& p, int64_t step) { return p2p::PeerRecord{{}, p.transport.address(), step, 0, 1.0}; };
  const auto everyone_sees_the_stepper = [&] { return everyone_sees(peers, stepper); };
  // Steps for 6 s (about 6 beats), counting what the stepper sends and checking the others' view of it.
  const int64_t frames_before = stepper.transport.stats().record_frames_sent;
  int64_t steps = 0;
  bool always_seen = true;
  const auto stepping_until = p2p::Clock::now() + 6s;
  while (p2p::Clock::now() < stepping_until) {
    stepper.directory.announce(record(stepper, ++steps));
    for (int i = 0; i < 3; ++i) {
      std::this_thread::sleep_for(100ms);
      always_seen = always_seen && everyone_sees_the_stepper();
    }
  }
  const int64_t beyond_steps = stepper.transport.stats().record_frames_sent - frames_before - 5 * steps;
  EXPECT_TRUE(always_seen) << "a peer lost the stepper's record while it stepped";
  // Each of about 6 beats: 2 frames (the gossip's peers) with the skip, 5 (every peer) without it.
  EXPECT_GE(beyond_steps, 4);
  EXPECT_LE(beyond_steps, 22) << steps << " steps";
  // Stopped, it is kept live by the heartbeat alone: past a TTL (4 s) every peer still sees it.
  EXPECT_TRUE(seen_throughout(peers, stepper, 23)) << "a peer lost the stepper's record once it stopped stepping";
}

// Note [A deal vouches for its members]: a member that a leader's deals name every 0.3 s sends its
// heartbeat only to the gossip's few, and every peer still holds its record live throughout, kept so by
// the deals; once the deals stop, its heartbeat goes to every peer again and keeps it live past a TTL.
TEST(SwarmDirectory, ADealVouchesForItsMembersAndTheirHeartbeatSkipsThePeersThatReadDeals) {
  Logs logs;
  const auto run = p2p::generate_run_key();
  auto peers = six_peers_past_their_welcome(run, 161, logs);  // a vouch skips the heartbeat for 1 s
  ASSERT_EQ(peers.size(), 6u) << "the peers did not meet";
  Peer &member = *peers[0], &leader = *peers[1];
  const auto everyone_sees_the_member = [&] { return everyone_sees(peers, member); };
  // The leader deals the member every 0.3 s for 6 s (about 6 beats), to every peer as send_deal does.
  const int64_t frames_before = member.transport.stats().record_frames_sent;
  bool always_seen = true;
  const uint64_t key = 1 + (uint64_t{1} << 32);
  uint64_t round = 0;
  const auto dealing_until = p2p::Clock::now() + 6s;
  while (p2p::Clock::now() < dealing_until) {
    const std::vector<p2p::Dealt> dealt{{member.transport.key(), key}};
    leader.directory.take_deal(static_cast<int64_t>(round) + 1, dealt);
    for (auto& p : peers)
      if (p.get() != &leader)
        leader.transport.send(p->transport.key(), p->transport.address(), {MessageKind::kDeal, round, 0},
                              p2p::detail::deal_body(dealt));
    ++round;
    for (int i = 0; i < 3; ++i) {
      std::this_thread::sleep_for(100ms);
      always_seen = always_seen && everyone_sees_the_member();
    }
  }
  const int64_t sent = member.transport.stats().record_frames_sent - frames_before;
  EXPECT_TRUE(always_seen) << "a peer lost the member's record while deals named it";
  // Each of about 6 beats: 2 frames (the gossip's peers) when vouched for, 5 (every peer) without it.
  EXPECT_GE(sent, 4);
  EXPECT_LE(sent, 20) << "frames sent in " << round << " deals";
  // No deal since: its heartbeat goes to every peer again, and keeps it live past a TTL (4 s).
  EXPECT_TRUE(seen_throughout(peers, member, 30)) << "a peer lost the member's record once the deals stopped";
}

// Note [A leader vouches for its members until its next round]: a leader deals a member once and stays
// on the dealt step, as between the slow rounds of a large target batch. For 8 s the member sends its
// heartbeat only to the gossip's few and its leader, every peer holding its record live throughout, kept
// so by the leader's re-sent deal, which goes on once the leader's own next round is done (the member's is
// not). Once the member dies, the leader stops naming it and every peer loses it within a TTL and 1.5
// beats; with nobody left to name, the leader sends no more deals.
TEST(SwarmDirectory, ALeaderVouchesForItsLiveMembersUntilItsNextRound) {
  Logs logs;
  const auto run = p2p::generate_run_key();
  auto peers = six_peers_past_their_welcome(run, 171, logs);  // the deal re-sent every 0.75 s
  ASSERT_EQ(peers.size(), 6u) << "the peers did not meet";
  Peer &member = *peers[0], &leader = *peers[1];
  const auto record = [](Peer& p, int64_t step) { return p2p::PeerRecord{{}, p.transport.address(), step, 0, 1.0}; };
  // Round 0's leader deals itself and the member to step 1, and is on step 1 from then on.
  leader.directory.announce(record(leader, 1));
  const uint64_t key = 1 + (uint64_t{1} << 32);
  const std::vector<p2p::Dealt> dealt{{member.transport.key(), key}, {leader.transport.key(), key + 1}};
  const int64_t frames_before = member.transport.stats().record_frames_sent;
  leader.directory.deal(0, dealt, leader.directory.peers());
  const bool always_seen = seen_throughout(peers, member, 40);  // 8 s, twice the TTL
  const int64_t sent = member.transport.stats().record_frames_sent - frames_before;
  EXPECT_TRUE(always_seen) << "a peer lost the member's record while its leader's deal stood";
  // Each of about 8 beats: at most 3 frames (the gossip's peers and the leader) vouched for, 5 without
  // (23 here; 38 with the deal sent once, not re-sent).
  EXPECT_GE(sent, 4);
  EXPECT_LE(sent, 30) << "frames the member sent in 8 s";
  // The leader's own next round is done; its member's is not, so the deal still stands for it.
  leader.directory.announce(record(leader, 2));
  std::this_thread::sleep_for(500ms);
  const int64_t deals_on = leader.transport.stats().deal_frames_sent;
  EXPECT_TRUE(seen_throughout(peers, member, 10)) << "a peer lost the member once its leader moved on";
  EXPECT_GT(leader.transport.stats().deal_frames_sent, deals_on) << "the deal stopped at the leader's next round";
  // The member dies; the leader goes on re-sending its deal for it while it hears its heartbeat.
  const auto member_key = member.transport.key();
  const int64_t deals_before = leader.transport.stats().deal_frames_sent;
  peers[0].reset();
  const auto anyone_sees_it = [&] {
    for (size_t i = 1; i < peers.size(); ++i) {
      const auto seen = peers[i]->directory.peers();
      if (std::any_of(seen.begin(), seen.end(), [&](const auto& r) { return r.key == member_key; })) return true;
    }
    return false;
  };
  const auto died = p2p::Clock::now();
  while (p2p::Clock::now() < died + 10s && anyone_sees_it()) std::this_thread::sleep_for(100ms);
  const double lost_after_s = std::chrono::duration<double>(p2p::Clock::now() - died).count();
  // At most a TTL (4 s) and 1.5 beats after its last heartbeat: 4.3 to 4.6 s here. Named until a TTL
  // after its last heartbeat, as before the leader checked, it was held live 7.1 s.
  EXPECT_LT(lost_after_s, 6.0) << "the dead member stayed live, vouched for by its leader's deal";
  EXPECT_GT(leader.transport.stats().deal_frames_sent, deals_before) << "the leader stopped re-sending its deal";
  // Past the dealt step itself and with no live member to name, the leader's deal no longer stands.
  const int64_t deals_after = leader.transport.stats().deal_frames_sent;
  std::this_thread::sleep_for(2s);
  EXPECT_EQ(leader.transport.stats().deal_frames_sent, deals_after) << "a deal re-sent past its step";
}

// Note [A deal vouches for its members]: a member that sends nothing (a heartbeat every 100 s) stays live
// past its TTL for as long as deals for a step ahead of its record name it, and expires a TTL after
// the last; a deal older than the last one for it vouches for nothing, even one for its record's step.
TEST(SwarmDirectory, ADealKeepsItsMembersRecordLiveForATtl) {
  Logs logs;
  const auto run = p2p::generate_run_key();
  p2p::DirectoryOptions silent;
  silent.announce_s = 100;
  Peer a(run, 167, "", logs), b(run, 168, a.transport.address(), logs, silent);
  ASSERT_TRUE(meet({{&a, p2p::PeerRecord{{}, a.transport.address(), 2, 0, 1.0}},
                    {&b, p2p::PeerRecord{{}, b.transport.address(), 2, 0, 1.0}}}));
  const auto b_live = [&] { return !a.directory.peers().empty(); };
  const std::vector<p2p::Dealt> dealt{{b.transport.key(), 1 + (uint64_t{1} << 32)}};
  bool always_live = true;
  for (int i = 0; i < 14; ++i) {  // 7 s, past the TTL of 4 s
    a.directory.take_deal(3, dealt);
    std::this_thread::sleep_for(500ms);
    always_live = always_live && b_live();
  }
  EXPECT_TRUE(always_live) << "a deal did not keep its member live";
  a.directory.take_deal(4, dealt);
  bool stale_vouched = true;
  for (int i = 0; i < 14 && stale_vouched; ++i) {
    a.directory.take_deal(2, dealt);  // for the step b's record is on
    a.directory.take_deal(3, dealt);  // late: a deal for step 4 came before it
    std::this_thread::sleep_for(500ms);
    stale_vouched = b_live();
  }
  EXPECT_FALSE(stale_vouched) << "b stayed live with no new deal, nor record, for 7 s";
}

// Note [A heartbeat to nobody is answered]: b sends nothing of itself (a heartbeat every 100 s), and a
// holds records for 1 s only, so a loses b's each second; a's heartbeat then goes to b's address
// addressed to nobody, and b answers it with its record, so a sees b again and again.
TEST(SwarmDirectory, AHeartbeatAddressedToNobodyIsAnsweredWithTheRecord) {
  Logs logs;
  const auto run = p2p::generate_run_key();
  p2p::DirectoryOptions forgetful, silent;
  forgetful.record_ttl_s = 1;
  silent.announce_s = 100;
  Peer a(run, 169, "", logs, forgetful), b(run, 170, a.transport.address(), logs, silent);
  ASSERT_TRUE(meet({{&a, p2p::PeerRecord{{}, a.transport.address(), 2, 0, 1.0}},
                    {&b, p2p::PeerRecord{{}, b.transport.address(), 2, 0, 1.0}}}));
  std::this_thread::sleep_for(3s);  // b's first records long expired at a
  int seen = 0;
  for (int i = 0; i < 30; ++i) {  // 3 s, about 3 of a's heartbeats
    std::this_thread::sleep_for(100ms);
    seen += a.directory.peers().empty() ? 0 : 1;
  }
  EXPECT_GE(seen, 5) << "a saw b's record in " << seen << " of 30 looks";
}

#endif  // COHORT_HAVE_SWARM

}  // namespace
}  // namespace cohort::p2p

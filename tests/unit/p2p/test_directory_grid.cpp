// The directory where grid coordinates stay (swarm.grid=fixed: Note [A grid whose coordinates stay] in
// parallel/swarm/SwarmGrid.cpp), with real sockets and a real OpenDHT on loopback (SwarmLoopback.h): which
// peers a change reaches.
#include <gtest/gtest.h>

#include <algorithm>
#include <thread>

#include "cohort/p2p/Directory.h"
#include "unit/p2p/SwarmLoopback.h"

namespace cohort::p2p {
namespace {

using namespace loopback;

#if COHORT_HAVE_SWARM

// Note [A grid whose coordinates stay] (parallel/swarm/SwarmGrid.cpp): where coordinates stay, a change of
// step goes to the peers that share a coordinate (Reach::kGrid), and a peer that shares none hears it only
// as far as the gossip takes it (no heartbeat comes within the test).
TEST(SwarmDirectory, AStepWhereCoordinatesStayGoesToThePeersThatShareOne) {
  Logs logs;
  const auto run = p2p::generate_run_key();
  const auto d = no_heartbeat_within_a_test();
  Peer a(run, 240, "", logs, never_in_the_dht()), b(run, 241, a.transport.address(), logs, d),
      c(run, 242, a.transport.address(), logs, d);
  // They meet with coordinates still dealt; then a stays at (0, 0), b at (0, 1), sharing a's column, and c
  // at (1, 1), sharing b's row and nothing of a's.
  const auto dealt = [](Peer& p, int64_t step) { return p2p::PeerRecord{{}, p.transport.address(), step, 0, 1.0}; };
  const auto record = [&](Peer& p, int64_t step, uint64_t c0, uint64_t c1) {
    auto r = dealt(p, step);
    r.grid = p2p::grid_word(c0, c1);
    r.group_key = p2p::fixed_key_at(r, step);
    return r;
  };
  ASSERT_TRUE(meet({{&a, dealt(a, 5)}, {&b, dealt(b, 5)}, {&c, dealt(c, 5)}}));
  b.directory.announce(record(b, 5, 0, 1));
  c.directory.announce(record(c, 5, 1, 1));
  const auto deadline = p2p::Clock::now() + 10s;
  const auto a_holds_them_fixed = [&] {
    const auto seen = a.directory.peers();
    return seen.size() == 2 && std::all_of(seen.begin(), seen.end(), [](const auto& r) { return p2p::grid_fixed(r); });
  };
  while (p2p::Clock::now() < deadline && !a_holds_them_fixed()) std::this_thread::sleep_for(20ms);
  ASSERT_TRUE(a_holds_them_fixed());
  const auto step_of_a = [&](Peer& p) -> int64_t {
    for (const auto& r : p.directory.peers())
      if (r.key == a.transport.key()) return r.step;
    return -1;
  };
  a.directory.announce(record(a, 6, 0, 0), p2p::Directory::Reach::kGrid);
  while (p2p::Clock::now() < deadline && step_of_a(b) != 6) std::this_thread::sleep_for(20ms);
  ASSERT_EQ(step_of_a(b), 6) << "b, which shares a's column, did not hear a's step";
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(step_of_a(c), 5) << "c, which shares no coordinate with a, heard a's step";
  // Without coordinates that stay, the same reach is a change for everyone.
  a.directory.announce(dealt(a, 7), p2p::Directory::Reach::kGrid);
  const auto again = p2p::Clock::now() + 10s;
  while (p2p::Clock::now() < again && step_of_a(c) != 7) std::this_thread::sleep_for(20ms);
  EXPECT_EQ(step_of_a(c), 7) << "c did not hear a's step once a's coordinates were dealt again";
}

#endif  // COHORT_HAVE_SWARM

}  // namespace
}  // namespace cohort::p2p

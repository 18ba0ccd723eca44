// Note [Peers that drifted apart resynchronize]: which peers a swarm peer takes its weights from when its
// digest is not the one most peers announced (drifted_from, a pure function of digests and records).
#include <gtest/gtest.h>

#if COHORT_HAVE_SWARM

#include <map>
#include <vector>

#include "cohort/p2p/Averager.h"
#include "cohort/parallel/swarm/SwarmPeer.h"

namespace cohort::parallel::swarm {
namespace {

p2p::PeerKey key(uint8_t first) {
  p2p::PeerKey k{};
  k[0] = first;
  return k;
}

p2p::PeerRecord record(uint8_t first, int64_t digest_step, uint64_t digest) {
  p2p::PeerRecord r;
  r.key = key(first);
  r.address = "127.0.0." + std::to_string(first) + ":7000";
  r.step = digest_step;
  r.digest_step = digest_step;
  r.digest = digest;
  return r;
}

std::vector<uint8_t> firsts(const std::vector<p2p::PeerRecord>& records) {
  std::vector<uint8_t> out;
  for (const auto& r : records) out.push_back(r.key[0]);
  return out;
}

TEST(Drift, APeerWithTheMajorityStaysAndTheOneApartTakesTheMajoritysWeights) {
  const std::vector<p2p::PeerRecord> others = {record(1, 10, 0xAA), record(2, 10, 0xAA), record(3, 10, 0xBB)};
  // Peer 4 shares the majority's digest: nothing to do.
  EXPECT_TRUE(drifted_from({{10, 0xAA}}, key(4), others).empty());
  // Peer 4 has its own weights: the two that agree are its donors (not peer 3, apart too).
  EXPECT_EQ(firsts(drifted_from({{10, 0xCC}}, key(4), others)), (std::vector<uint8_t>{1, 2}));
}

TEST(Drift, ATieGoesToTheSetHoldingTheSmallestKeySoOnlyOneSideGivesWay) {
  // Two peers apart: the one with the larger key gives way, the other keeps its weights.
  EXPECT_EQ(firsts(drifted_from({{7, 0x22}}, key(5), {record(3, 7, 0x11)})), (std::vector<uint8_t>{3}));
  EXPECT_TRUE(drifted_from({{7, 0x11}}, key(3), {record(5, 7, 0x22)}).empty());
}

TEST(Drift, OnlyTheLatestStepBothSidesKnowIsCompared) {
  // The other peer's digest is for step 9, which this peer knows and agrees with; its step-8 digest (an
  // older record of another peer) is not compared.
  const std::map<int64_t, uint64_t> mine = {{8, 0x01}, {9, 0x02}};
  EXPECT_TRUE(drifted_from(mine, key(9), {record(1, 9, 0x02), record(2, 8, 0x99)}).empty());
  // Nobody announced a step this peer has a digest for (a record without one, or a step it never had).
  EXPECT_TRUE(drifted_from(mine, key(9), {record(1, -1, 0), record(2, 12, 0x55)}).empty());
  // Without digests of its own (just after a download) it cannot tell.
  EXPECT_TRUE(drifted_from({}, key(9), {record(1, 9, 0x02)}).empty());
}

// Note [Weights averaged at every step in bounded groups]: swarm.average_state_every's default (0) is every
// step for the swarm and every 10 outer rounds for DiLoCo; a value given is taken by both.
TEST(Drift, WeightsAreAveragedEveryStepInBoundedGroupsUnlessSaidOtherwise) {
  SwarmConfig c;
  EXPECT_EQ(c.average_state_every, 0);
  EXPECT_EQ(state_average_every(c, false), 1);
  EXPECT_EQ(state_average_every(c, true), 10);
  c.average_state_every = 7;
  EXPECT_EQ(state_average_every(c, false), 7);
  EXPECT_EQ(state_average_every(c, true), 7);
}

// Note [Groups on a grid]: about one key per group_size peers, never more than one per two peers, so no
// key is dealt a peer alone (three peers in groups of 2 had two keys, one of them a peer's own).
TEST(Drift, TheGridHasAboutOneKeyPerGroupAndNeverOneForALonePeer) {
  EXPECT_EQ(p2p::grid_keys(64, 8), 8);
  EXPECT_EQ(p2p::grid_keys(60, 8), 8);
  EXPECT_EQ(p2p::grid_keys(24, 8), 3);
  EXPECT_EQ(p2p::grid_keys(4, 2), 2);
  EXPECT_EQ(p2p::grid_keys(3, 2), 1);  // round(1.5) = 2 before the bound
  EXPECT_EQ(p2p::grid_keys(5, 2), 2);  // round(2.5) = 3: a key of one
  EXPECT_EQ(p2p::grid_keys(1, 8), 1);
  EXPECT_EQ(p2p::grid_keys(2, 8), 1);
}

// Note [Groups on a grid]: the members of one key, in their places, are dealt every key of the next
// round's dimension in turn, never key 0 ("any group"), and the dimension alternates with the round.
TEST(Drift, AKeysPlacesAreDealtEveryKeyOfTheNextDimensionInTurn) {
  constexpr int64_t kKeys = 5;
  for (const uint64_t round : {6u, 7u}) {
    const uint64_t key = 1 + ((round % 2) << 32) + 3;
    std::map<uint64_t, int> dealt;
    for (int64_t place = 0; place < 2 * kKeys; ++place) {
      const auto next = p2p::next_group_key(key, round, place, kKeys);
      EXPECT_NE(next, 0u);
      EXPECT_EQ((next - 1) >> 32, (round + 1) % 2) << "the next round averages along the other dimension";
      EXPECT_LT((next - 1) & 0xFFFFFFFFu, static_cast<uint64_t>(kKeys));
      ++dealt[next];
      if (place >= kKeys) {
        EXPECT_EQ(next, p2p::next_group_key(key, round, place - kKeys, kKeys));
      }
    }
    EXPECT_EQ(dealt.size(), static_cast<size_t>(kKeys));
    for (const auto& [next, n] : dealt) EXPECT_EQ(n, 2) << "key " << next;
  }
}

}  // namespace
}  // namespace cohort::parallel::swarm

#endif  // COHORT_HAVE_SWARM

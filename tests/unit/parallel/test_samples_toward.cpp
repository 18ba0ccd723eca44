// Note [The target batch counted in the key and scaled to the swarm]: how many samples a swarm peer
// counts toward a step (samples_toward, a pure function of its own samples and the live records).
#include <gtest/gtest.h>

#if COHORT_HAVE_SWARM

#include <vector>

#include "cohort/parallel/swarm/SwarmPeer.h"

namespace cohort::parallel::swarm {
namespace {

constexpr int64_t kBatch = 32;

p2p::PeerRecord peer(uint8_t first, int64_t step, uint64_t group_key, int64_t samples, bool ready = false) {
  p2p::PeerRecord r;
  r.key[0] = first;
  r.address = "127.0.0." + std::to_string(first) + ":7000";
  r.step = step;
  r.group_key = group_key;
  r.samples = samples;
  r.ready = ready;
  return r;
}

// Sixteen peers on step 5 in two keys of eight: this peer (key 1) and seven others of key 1 that have each
// trained two batches and are on their third, and eight of key 2 whose records last said 0 (their
// progress goes to their own key only).
std::vector<p2p::PeerRecord> two_keys() {
  std::vector<p2p::PeerRecord> peers;
  for (uint8_t i = 1; i <= 7; ++i) peers.push_back(peer(i, 5, 1, 2 * kBatch));
  for (uint8_t i = 8; i <= 15; ++i) peers.push_back(peer(i, 5, 2, 0));
  return peers;
}

TEST(TargetBatch, WithoutGroupsEveryRecordCountsAsAnnounced) {
  const auto peers = two_keys();
  // 2 batches of its own; 7 peers at 2 batches with a third under way; 8 at 0 with a first under way.
  EXPECT_EQ(samples_toward(5, 2 * kBatch, kBatch, 0, 16, peers, 0.0), 2 * kBatch + 7 * 3 * kBatch + 8 * kBatch);
}

TEST(TargetBatch, WithGroupsTheKeysCountIsScaledToTheSwarm) {
  auto peers = two_keys();
  const int64_t key = 2 * kBatch + 7 * 3 * kBatch;  // this peer's key: 8 peers
  EXPECT_EQ(samples_toward(5, 2 * kBatch, kBatch, 1, 16, peers, 0.0), key * 2);
  // The other key's records say nothing to it: they may be a heartbeat old.
  for (auto& p : peers)
    if (p.group_key == 2) p.samples = 10 * kBatch, p.ready = true;
  EXPECT_EQ(samples_toward(5, 2 * kBatch, kBatch, 1, 16, peers, 0.0), key * 2);
  // A ready peer of the key counts its samples, with no batch under way.
  peers[0].ready = true;
  EXPECT_EQ(samples_toward(5, 2 * kBatch, kBatch, 1, 16, peers, 0.0), (key - kBatch) * 2);
}

TEST(TargetBatch, APeerDealtToTheKeyCountsAsABatchAndOneStepBehindIsLeftToTheScale) {
  std::vector<p2p::PeerRecord> peers{peer(1, 5, 1, kBatch), peer(2, 4, 9, 0), peer(3, 4, 9, 0)};
  peers[1].dealt_step = 5;  // its round's leader dealt it to this step and key
  peers[1].dealt_key = 1;
  // This peer (a batch), peer 1 (a batch, another under way), peer 2 (dealt: a batch under way): 3 of a
  // swarm of 6. Peer 3, one step behind and not dealt yet, may come to any key: the scale stands for it.
  EXPECT_EQ(samples_toward(5, kBatch, kBatch, 1, 6, peers, 0.0), (kBatch + 2 * kBatch + kBatch) * 2);
  // Without groups, peer 3 counts as a batch it is about to start.
  EXPECT_EQ(samples_toward(5, kBatch, kBatch, 0, 6, peers, 0.0), kBatch + 2 * kBatch + kBatch + kBatch);
}

TEST(TargetBatch, ASwarmNoLargerThanTheKeyIsNotScaled) {
  std::vector<p2p::PeerRecord> peers{peer(1, 5, 1, kBatch), peer(2, 5, 1, kBatch, true)};
  p2p::PeerRecord leaving = peer(3, 5, 1, 5 * kBatch);
  leaving.leaving = true;  // a peer that said it leaves contributes nothing
  peers.push_back(leaving);
  EXPECT_EQ(samples_toward(5, 0, kBatch, 1, 3, peers, 0.0), 3 * kBatch);
  EXPECT_EQ(samples_toward(5, 0, kBatch, 1, 1, peers, 0.0), 3 * kBatch) << "a count below the key's is stale";
}

// Note [Samples trained since the record]: a peer still training has trained on at its speed since this
// peer took its record in; whole batches count, for at most twice the gap between its records' sends.
TEST(TargetBatch, APeerStillTrainingCountsTheWholeBatchesItTrainedSinceItsRecord) {
  auto training = peer(1, 5, 0, 2 * kBatch);
  training.samples_per_s = 100.0 * kBatch;  // a batch every 10 ms
  training.taken_unix = 1000.0;
  training.heard_unix = 990.0;  // its writer's clock, 10 s behind: not read
  const std::vector<p2p::PeerRecord> peers{training};
  const auto at = [&](double now) { return samples_toward(5, 0, kBatch, 0, 2, peers, now); };
  // 25 ms on: two whole batches since, and one under way (counted as the batch in flight).
  EXPECT_EQ(at(1000.025), 2 * kBatch + 2 * kBatch + kBatch);
  // 9 ms on: the batch under way only; counting its part too would count it twice.
  EXPECT_EQ(at(1000.009), 2 * kBatch + kBatch);
  // 90 ms on, within twice the gap: nine.
  EXPECT_EQ(at(1000.09), 2 * kBatch + 9 * kBatch + kBatch);
  // A record older than twice the gap is a peer that trained no batch since (stalled, dead, or of batches
  // that long): its samples and a batch, as before.
  EXPECT_EQ(at(1000.0 + 2 * p2p::Directory::kMinDirectGapS + 0.01), 2 * kBatch + kBatch);
  // A ready peer trains no more.
  auto ready = training;
  ready.ready = true;
  EXPECT_EQ(samples_toward(5, 0, kBatch, 0, 2, {ready}, 1000.025), 2 * kBatch);
}

// All of it together: the key's peers with what they trained since their records, scaled to the swarm.
TEST(TargetBatch, TheKeysCountWithTheBatchesSinceItsRecordsIsScaledToTheSwarm) {
  auto peers = two_keys();
  for (auto& p : peers) {
    p.samples_per_s = 100.0 * kBatch;
    p.taken_unix = 1000.0;
  }
  // Each of the key's 7 others: 2 batches announced, 3 since, 1 under way; this peer's 2; the other
  // key's 8 left out; 8 of a swarm of 16.
  EXPECT_EQ(samples_toward(5, 2 * kBatch, kBatch, 1, 16, peers, 1000.035), (2 * kBatch + 7 * 6 * kBatch) * 2);
}

}  // namespace
}  // namespace cohort::parallel::swarm

#endif  // COHORT_HAVE_SWARM

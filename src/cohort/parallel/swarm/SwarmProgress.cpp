// A swarm peer's progress toward a step: whether the swarm has its target batch (ready, samples_toward),
// and where this peer is, told to whom (progress, announce_at), and where the others are
// (others_progress). The rest of the peer is parallel/swarm/SwarmPeer.cpp's.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <vector>

#include "cohort/p2p/Averager.h"
#include "cohort/p2p/Directory.h"
#include "cohort/parallel/swarm/SwarmPeer.h"

namespace cohort::parallel::swarm {

// Note [A swarm step is the target batch, not twice it]
// Counting only the samples the others have announced, every peer of a swarm whose batches together make
// the target finished its batch, saw the others' counts still at 0 (their batches ending at the same
// moment, their records on the way), and trained another: each global step took about two batches a
// peer, twice the target and twice ddp's work for the same step (bench/swarm.py: the swarm's step twice
// ddp's, at 100 Mbit/s and 10). Hivemind's peers overshoot the same way (1.9 to 2.1 times, measured).
// So a peer counts the batch each other peer on this step is still training on (not yet ready), and
// each peer one step behind, about to start one: when those complete the target, it stops and waits
// in matchmaking, whose leader waits for every live peer on the step. A batch is this peer's own size;
// a peer that dies mid-batch leaves the round short of the target, as Hivemind's is.
bool SwarmPeer::ready(int64_t step, int64_t samples, int64_t target, int64_t batch) {
  const auto peers = directory_->peers();
  check_membership(peers);
  log_peers_ahead(step, peers);
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - since_).count();
  if (elapsed > 0) samples_per_s_ = samples / elapsed;
  // Note [The target batch counted in the key and scaled to the swarm]; a live peer of an earlier
  // release counts every record, so it hears every peer's progress as before.
  const uint64_t key = cfg_.group_size > 0 && all_take_deals(peers) ? group_key_for(step) : 0;
  int64_t swarm = leader_swarm_;
  if (swarm <= 0)
    swarm = 1 + std::count_if(peers.begin(), peers.end(), [](const p2p::PeerRecord& p) { return !p.leaving; });
  // Where coordinates stay a peer holds its mates' records alone: the swarm is its key's peers, once a key
  // of the keys along its dimension, which grow as keys split (Note [A grid whose coordinates stay] in
  // SwarmGrid.cpp, Note [An overfull key splits] in p2p/Matchmaking.cpp).
  if (coordinates_stay() && grid_keys_ > 0 && key != 0)
    swarm = std::max(grid_keys_, p2p::grid_keys_along(peers, p2p::key_coordinate(key), step)) *
            (1 + std::count_if(peers.begin(), peers.end(), [&](const p2p::PeerRecord& p) {
               return !p.leaving && p2p::grid_fixed(p) && p2p::fixed_key_at(p, step) == key;
             }));
  const bool ready = samples_toward(step, samples, batch, key, swarm, peers, p2p::detail::unix_now()) >= target;
  // The samples that make it ready change no other group's count (Note [Readiness goes to the group]).
  const bool to_key = ready || key != 0;
  announce_at(step, samples, false, to_key ? p2p::Directory::Reach::kGroup : p2p::Directory::Reach::kEveryone);
  return ready;
}

// Note [The target batch counted in the key and scaled to the swarm]
// A peer counted the swarm's samples toward a step from every peer's record, so each peer still training
// sent its record to every live peer after each batch: N - 1 frames a peer a batch (issue 41: 64 peers in
// groups of 8, four batches a step, 189 kB of records a peer a step, 12.9 times 8 peers'). With
// swarm.group_size a peer counts only the peers of its group key on the step (and those dealt there),
// which hear each other's progress, and scales their count by the swarm's live peers over the peers
// counted: the key stands for the swarm. Its progress then goes to its key's peers only (Reach::kGroup);
// the others hear it with the heartbeat. The swarm's size is an aggregate the last round's leader sends
// with the group (the live peers it knows, RoundOutcome::swarm), not a count of every record; a peer that
// had no group last round (its first step, a round alone, a download of the state) counts its live records.
// What this keeps: when the peers' counts of the swarm agree, each key stops at its share of the target,
// k / N of it for k peers, so a global step is still the target however the groups fall, give or take a
// batch a key; a key that lost a peer trains on until its share is in, once the dead peer's record
// expires (a TTL; till then it counts as its samples and a batch, as before). A key's peers seen late only
// shrink the sample it scales, as a peer one step behind did before (it counted as a batch). What it
// gives up: a key's share is by peers, not by speed, so a fast key no longer trains for a slow one; but
// each key of the next round takes a member of each group of this one (Note [Groups on a grid] in
// p2p/Matchmaking.cpp), so the swarm already stepped at its slowest key's pace.
// Note [Samples trained since the record]
// A change of a peer's samples goes out at most every Directory::kMinDirectGapS (50 ms), so a reader's
// view of a peer still training lags by up to that, and by the frame's way. With batches of a few
// milliseconds that is several batches a peer: 8 peers of the MLP, a target of four batches a peer,
// trained 1.9 to 3.5 times the target a step, 7 to 25 batches a peer where 4 would do (docs/scaling.md,
// "The target batch counted in the key, scaled to the swarm"). So a peer still training counts as what
// it announced, plus the whole batches it trained since at the speed it announced, plus the batch under
// way. Hivemind's progress tracker estimates its peers' samples by their speed the same way, for its
// time to the next epoch. Whole batches only: a peer sends its record as a batch ends, so with batches
// longer than the gap the time since is the batch under way, which is already counted (a fraction of a
// batch a peer would have stopped the swarm short of the target). The time is this peer's own, from
// when it took the record in (PeerRecord::taken_unix): no clock of another machine enters. A record
// older than twice the gap is of a peer that trained no batch since, or of one whose batches are longer
// than that: nothing is added for it, so a peer stalled or dead counts as before, its samples and a
// batch, until its record expires.
int64_t samples_toward(int64_t step, int64_t samples, int64_t batch, uint64_t key, int64_t swarm,
                       const std::vector<p2p::PeerRecord>& peers, double now_unix) {
  const auto since_record = [&](const p2p::PeerRecord& p) -> int64_t {
    const double age = now_unix - p.taken_unix;
    if (batch <= 0 || age <= 0 || age > 2 * p2p::Directory::kMinDirectGapS) return 0;
    const double batches = std::max(0.0, p.samples_per_s) * age / static_cast<double>(batch);
    return static_cast<int64_t>(std::floor(batches + 1e-9)) * batch;
  };
  int64_t total = samples, counted = 1;
  for (const auto& p : peers) {
    if (p.leaving) continue;
    // Where its last round's leader dealt it, when its own record is not there yet (Note [A leader deals its
    // groups over the next round's keys] in p2p/Matchmaking.cpp): dealt to this step it trains a batch for
    // it, dealt past it it is in a round of this step (its samples unknown here: a batch).
    const auto at = p2p::as_dealt(p);
    if (key != 0 && (at.step != step || at.group_key != key)) continue;
    if (p.step == step)
      total += p.samples + (p.ready ? 0 : since_record(p) + batch);
    else if (at.step == step || at.step + 1 == step || (p.step < step && at.step > step))
      total += batch;
    else
      continue;
    ++counted;
  }
  if (key == 0 || swarm <= counted) return total;
  return static_cast<int64_t>(static_cast<double>(total) * static_cast<double>(swarm) / static_cast<double>(counted));
}

void SwarmPeer::log_peers_ahead(int64_t step, const std::vector<p2p::PeerRecord>& peers) {
  for (const auto& p : peers) {
    if (p.leaving || p.step <= step || behind_logged_ == step) continue;
    behind_logged_ = step;
    log("swarm: peer " + p2p::peer_name(p.key) + " is at step " + std::to_string(p.step) + ", this peer at " +
        std::to_string(step) + (p.step > step + 1 ? ": downloading the state after this step" : ""));
  }
}

// Note [A DiLoCo peer's progress goes to its key]
// A DiLoCo peer announced where it was within its outer round at every inner step to every live peer:
// N - 1 frames a peer an inner step, nearly all of its record bytes (64 peers in groups of 8: 44 to 46
// kB a peer an inner step, docs/scaling.md). Only a newcomer reads it (others_progress: Note [A DiLoCo
// newcomer starts where the others are] in DilocoStrategy.cpp), once, after its download. So with
// swarm.group_size it goes to every live peer at most once every swarm.announce_s, and to the peers of
// its key otherwise: a newcomer reads where the others are at most that late (plus a frame's way), as it
// would from their heartbeat, which the deals let skip it once it is no longer new to them (Note [A
// heartbeat skips the peers that heard this one lately] in p2p/DirectorySend.cpp). The round's leader
// waits for a newcomer that starts a little behind as for any peer late to the round. A live peer of an
// earlier release still hears every inner step, as before.
void SwarmPeer::progress(int64_t step, int64_t samples) {
  const auto now = std::chrono::steady_clock::now();
  const bool keyed = cfg_.group_size > 0 && all_take_deals();
  const bool everyone = !keyed || now - progress_to_everyone_ >= std::chrono::duration<double>(cfg_.announce_s);
  if (everyone) progress_to_everyone_ = now;
  announce_at(step, samples, false, everyone ? p2p::Directory::Reach::kEveryone : p2p::Directory::Reach::kGroup);
}

// This peer's record: on `step` with `samples` toward it, not ready (matchmaking announces readiness).
void SwarmPeer::announce_at(int64_t step, int64_t samples, bool leaving, p2p::Directory::Reach reach) {
  p2p::PeerRecord r{{}, transport_->address(), step, samples, samples_per_s_, false, leaving, 0, last_group_size_};
  r.group_key = group_key_for(step);
  r.grid = grid_word();
  r.census = census();
  directory_->announce(r, reach);
}

int64_t SwarmPeer::others_progress(int64_t step) const {
  int64_t most = 0;
  for (const auto& p : directory_->peers())
    if (p.step == step) most = std::max(most, p.samples);
  return most;
}

}  // namespace cohort::parallel::swarm

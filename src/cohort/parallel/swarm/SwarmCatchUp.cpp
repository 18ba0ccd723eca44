// A swarm peer catching up (SwarmPeer's half that serves and downloads state): a newcomer, a peer two steps
// behind, one that fell out of a round, or one whose weights drifted from the majority's takes a live
// peer's state between steps (Notes [A newcomer catches up] in SwarmStrategy.cpp and [Peers that drifted
// apart resynchronize] below). The rounds and the directory are SwarmPeer.cpp's.
#include <algorithm>

#include "cohort/p2p/Directory.h"
#include "cohort/p2p/Transport.h"
#include "cohort/parallel/swarm/SwarmPeer.h"

namespace cohort::parallel::swarm {

void SwarmPeer::serve_state(int64_t step, const std::function<std::string()>& make_state) {
  serving_step_ = step;
  make_state_ = make_state;
  state_server_.serve(*transport_, step, make_state);
}

std::optional<p2p::DownloadedState> SwarmPeer::catch_up(int64_t step) {
  const bool starting = !started_;
  started_ = true;
  const auto peers = live_peers(starting);
  if (starting) check_membership(peers);
  const bool resync = out_of_step_ && !peers.empty();
  out_of_step_ = false;
  int64_t ahead = step;
  // A peer dealt to a step is there (Note [A leader deals its groups over the next round's keys]): its record
  // may reach this one a heartbeat later.
  for (const auto& p : peers) ahead = std::max(ahead, p2p::as_dealt(p).step);
  bool drifted = false;
  auto donors = donors_for(step, ahead, peers, starting, resync, drifted);
  if (donors.empty()) return std::nullopt;
  // See comm/FaultInjection.h: COHORT_FAULT_SWARM_FIRST_DONOR=HOST:PORT is the donor asked first.
  if (const char* first = std::getenv("COHORT_FAULT_SWARM_FIRST_DONOR")) {
    const size_t at = transport_->key()[0] % donors.size();
    for (auto& d : donors)
      if (d.address == first) std::swap(d, donors[at]);
  }
  log("swarm: the swarm is at step " + std::to_string(ahead) + ", this peer at " + std::to_string(step) +
      (drifted  ? " with other weights than most peers"
       : resync ? " and out of step with it"
                : "") +
      ": downloading the state from " + std::to_string(donors.size()) + " peer(s)");
  auto got = download_newest(donors);
  // Note [A peer never goes back]
  // A state behind this peer's own step is not taken. The trainer's data
  // loader cannot rewind (a run that went 20 steps back ran out of batches and failed), and that state
  // is older than what this peer trained. Donors are peers on this step or ahead, and serve the step
  // they announce (a DiLoCo peer that caught up served its own last boundary instead, rounds old: fixed
  // in DilocoStrategy), so this is the last line, not the rule.
  if (got && got->step < step) {
    log("swarm: the state that arrived is of step " + std::to_string(got->step) + ", behind this peer's " +
        std::to_string(step) + ": not taken; this peer goes on with its own");
    return std::nullopt;
  }
  if (got) {
    digests_.clear();   // the steps' weights this peer had are no longer its own
    leader_swarm_ = 0;  // its last leader's count may be long past: count the live records until a group
    // Note [A peer that caught up says where it is]
    // Its record still names the step it was on before
    // (a DiLoCo peer announces only after its outer rounds), so a leader on the step it landed on would
    // not count it as coming and close the round without it; it would then step alone as a straggler,
    // download again, land late again, and never average with the others (seen: a DiLoCo newcomer one
    // round behind for good, ending 0.098 apart). Announced on that step, it is waited for.
    if (last_group_size_ <= 1) join_smallest_group(got->step);  // Note [A lone peer joins the smallest group]
    announce_at(got->step, 0);
    std::string names;
    for (const auto& d : got->donors) names += (names.empty() ? "" : ", ") + d;
    log("swarm: caught up to step " + std::to_string(got->step) + " in " + std::to_string(got->seconds) + " s from " +
        names + " (" + std::to_string(got->bytes.size()) + " bytes, digest verified)");
  }
  return got;
}

std::vector<p2p::PeerRecord> SwarmPeer::live_peers(bool starting) {
  auto peers = starting ? directory_->fresh_peers(2 * cfg_.announce_s) : directory_->peers();
  // A peer that joins through live peers finds them before it trains alone: its DHT node may need a few
  // reads before the first answer (seen: a newcomer that found nobody at start trained alone 50 steps).
  // A twin of a live peer, or a peer of another run, finds nobody either, but learns why within a read:
  // check_membership stops it then, as it does in wait_for_peers (Note [A peer that is alone says why]),
  // in about a second where it waited out the whole patience (5 s with the default swarm.announce_s).
  const auto patience = std::chrono::steady_clock::now() + std::chrono::duration<double>(5 * cfg_.announce_s);
  while (starting && peers.empty() && !cfg_.initial_peers.empty() && std::chrono::steady_clock::now() < patience) {
    check_membership(peers);
    peers = directory_->fresh_peers(cfg_.announce_s);
  }
  return peers;
}

// At start: anyone ahead. Between steps: two steps ahead, or, after a round without this peer, a peer on
// this step or ahead (Note [A peer that fell out of a round resynchronizes]), or the peers whose weights
// most peers share when this peer's differ (Note [Peers that drifted apart resynchronize]). None: no
// download.
std::vector<p2p::PeerRecord> SwarmPeer::donors_for(int64_t step, int64_t ahead,
                                                   const std::vector<p2p::PeerRecord>& peers, bool starting,
                                                   bool resync, bool& drifted) const {
  // With swarm.group_size the groups' weights differ between parameter averagings by design: digests are
  // not compared (Note [Groups on a grid]).
  auto majority = starting || cfg_.group_size > 0 ? std::vector<p2p::PeerRecord>{}
                                                  : drifted_from(digests_, transport_->key(), peers);
  // Only those of the majority on this peer's step or ahead: the others are taken once there (Note [A peer
  // never goes back]).
  majority.erase(
      std::remove_if(majority.begin(), majority.end(), [&](const p2p::PeerRecord& p) { return p.step < step; }),
      majority.end());
  drifted = !majority.empty() && ahead <= step + 1;
  if (!resync && !drifted && ahead <= step + (starting ? 0 : 1)) return {};
  // Donors: the peers ahead (a step behind the leaders too, so a second donor is there when the first
  // dies: a download that loses its donor starts over from the next one), the leaders first.
  // A peer that drifted takes the majority's state instead.
  // A peer's step is where its last round's leader dealt it, if that is ahead of its record: outside its
  // key its own record comes seldom (Note [A deal vouches for its members] in p2p/DirectorySend.cpp).
  std::vector<p2p::PeerRecord> donors = majority;
  if (!drifted) {
    donors.clear();
    for (const auto& p : peers)
      if (p2p::as_dealt(p).step >= std::max(ahead - 1, step + (resync ? 0 : 1)) &&
          (!resync || p.group_size > last_group_size_))
        donors.push_back(p);
  }
  std::stable_sort(donors.begin(), donors.end(), [](const p2p::PeerRecord& a, const p2p::PeerRecord& b) {
    return p2p::as_dealt(a).step > p2p::as_dealt(b).step;
  });
  return donors;
}

// Note [A download lands on the leaders' step]
// The swarm's steps can be shorter than a download, so the
// state may arrive a step behind the leaders, whose group has then closed; a peer left there waits out
// a matchmaking period alone and falls out of step. While the leaders are ahead of what arrived, the
// newer state is fetched again (a few times at most: each is a step's worth of bytes).
std::optional<p2p::DownloadedState> SwarmPeer::download_newest(const std::vector<p2p::PeerRecord>& donors) {
  const auto say = [this](const std::string& line) { log(line); };
  const double timeout_s = std::min(5.0, cfg_.averaging_timeout_s);
  // Note [A donor that left is not asked]: peers() leaves out those that said so and those expired.
  const auto gone = [this](const p2p::PeerKey& key) {
    const auto live = directory_->peers();
    return std::none_of(live.begin(), live.end(), [&](const p2p::PeerRecord& p) { return p.key == key; });
  };
  auto got = p2p::download_state(*transport_, donors, timeout_s, say, gone);
  for (int again = 0; got && again < 3; ++again) {
    std::vector<p2p::PeerRecord> leaders;
    for (const auto& p : directory_->peers())
      if (p2p::as_dealt(p).step > got->step) leaders.push_back(p);
    if (leaders.empty()) break;
    auto newer = p2p::download_state(*transport_, leaders, timeout_s, say, gone);
    if (!newer || newer->step <= got->step) break;
    got = std::move(newer);
  }
  return got;
}

void SwarmPeer::settled(int64_t step, const std::function<uint64_t()>& digest_of_weights) {
  // With swarm.group_size the digests are never compared (donors_for), and hashing every parameter after
  // every step is not free: BLAKE2b at about 660 MB/s here, 68 ms a step of ResNet-18's on one core.
  if (cfg_.group_size > 0) return;
  const uint64_t digest = digest_of_weights();
  digests_[step] = digest;
  while (digests_.size() > 8) digests_.erase(digests_.begin());
  directory_->announce_digest(step, digest);
}

// Note [Peers that drifted apart resynchronize]
// Averaging gradients keeps peers' weights equal only while every round includes them all: a peer that
// averaged in a smaller group (it joined a round late, a part from a dead member was lost, two groups
// formed at once) goes on with other weights, for good. Hivemind averages the parameters now and then
// (average_state_every) and accepts the drift in between; a cohort peer announces a digest of its
// weights after each step (weights_digest: their bytes, so equal digests mean equal bits) and compares
// it with the digests the others announced for the latest step both know. When the largest set of peers
// agreeing on one digest (ties: the set holding the smallest peer key, so two peers never both give way)
// is not this peer's, it downloads their state between steps, as a newcomer does. One download, not a
// round of averaging: the swarm's weights stay those its majority trained.
std::vector<p2p::PeerRecord> drifted_from(const std::map<int64_t, uint64_t>& digests, const p2p::PeerKey& me,
                                          const std::vector<p2p::PeerRecord>& peers) {
  int64_t step = -1;
  for (const auto& p : peers)
    if (p.digest_step >= 0 && digests.count(p.digest_step)) step = std::max(step, p.digest_step);
  if (step < 0) return {};
  const uint64_t mine = digests.at(step);
  struct Holders {
    std::vector<p2p::PeerRecord> peers;
    size_t count = 0;
    p2p::PeerKey smallest{};
  };
  std::map<uint64_t, Holders> by_digest;
  const auto hold = [&](uint64_t digest, const p2p::PeerKey& key) {
    auto& h = by_digest[digest];
    if (h.count == 0 || key < h.smallest) h.smallest = key;
    ++h.count;
  };
  hold(mine, me);
  for (const auto& p : peers)
    if (p.digest_step == step) {
      hold(p.digest, p.key);
      by_digest[p.digest].peers.push_back(p);
    }
  const auto best = std::max_element(by_digest.begin(), by_digest.end(), [](const auto& a, const auto& b) {
    return a.second.count != b.second.count ? a.second.count < b.second.count : b.second.smallest < a.second.smallest;
  });
  if (best->first == mine) return {};
  return best->second.peers;
}

}  // namespace cohort::parallel::swarm

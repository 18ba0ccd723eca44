// A swarm peer's place on the grid of groups (Note [Groups on a grid] in p2p/Matchmaking.cpp): the group
// key it announces for a step, where its round's leader deals it next, the smallest group a lone peer
// joins, and whether every live peer reads the leaders' deals (Note [A leader deals its groups over the
// next round's keys]). The rest of the peer is parallel/swarm/SwarmPeer.cpp's.
#include <algorithm>
#include <map>

#include "cohort/p2p/Averager.h"
#include "cohort/parallel/swarm/SwarmPeer.h"

namespace cohort::parallel::swarm {
uint64_t SwarmPeer::group_key_for(int64_t step) const {
  if (cfg_.group_size <= 0) return 0;
  const auto d = static_cast<uint64_t>(step % 2);
  return 1 + (d << 32) + grid_[1 - d];  // never 0: that is "any group"
}

// The next round's key is the coordinate this round sets (p2p::next_group_key, the leader's deal); a peer
// whose leader did not say how many keys it dealt over counts them itself.
void SwarmPeer::move_on_grid(int64_t step, int64_t place, int64_t keys) {
  if (cfg_.group_size <= 0) return;
  if (keys <= 0) keys = p2p::grid_keys(static_cast<int64_t>(directory_->peers().size() + 1), cfg_.group_size);
  const uint64_t next = p2p::next_group_key(group_key_for(step), static_cast<uint64_t>(step), place, keys);
  grid_[static_cast<size_t>(step % 2)] = (next - 1) & 0xFFFFFFFFULL;
}

// Note [A lone peer joins the smallest group]
// The grid deals a group's members over the next round's keys; a peer that was in no group (a newcomer,
// or one the others' round closed without, as a peer that came up late) is dealt from a key of its own,
// and lands where others may already be M: it is split off alone again, round after round (seen: a
// DiLoCo peer alone in its first three of five rounds, downloading the others' state after each). So
// before it announces the next step (after its lone round, or where a download landed it), it takes,
// of the keys other peers on that step announce, the one fewest announce, staying on its own on a tie.
// Only peers whose last round had company count: another lone peer's key is as arbitrary as its own.
// Announced before matchmaking, the key is the one the others' leader waits for it under.
void SwarmPeer::join_smallest_group(int64_t step) {
  if (cfg_.group_size <= 0) return;
  const auto d = static_cast<uint64_t>(step % 2);
  // Others per key; a key nobody else announces is no group to join.
  std::map<uint64_t, int64_t> others;
  for (const auto& record : directory_->peers()) {
    const auto p = p2p::as_dealt(record);  // a peer dealt to the step is there already
    if (p.step == step && !p.leaving && p.group_size > 1 && p.group_key > 0 && ((p.group_key - 1) >> 32) == d)
      ++others[p.group_key];
  }
  if (others.empty()) return;
  const uint64_t mine = group_key_for(step);
  uint64_t best = others.count(mine) ? mine : others.begin()->first;
  for (const auto& [key, n] : others)
    if (n < others[best]) best = key;
  grid_[1 - d] = (best - 1) & 0xFFFFFFFFULL;
}

// A live peer of an earlier release reads no deal: it learns a change of step only from the change itself.
bool SwarmPeer::all_take_deals() const { return all_take_deals(directory_->peers()); }

bool SwarmPeer::all_take_deals(const std::vector<p2p::PeerRecord>& peers) {
  return std::all_of(peers.begin(), peers.end(),
                     [](const p2p::PeerRecord& p) { return (p.features & p2p::PeerRecord::kTakesDeals) != 0; });
}

}  // namespace cohort::parallel::swarm

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
void SwarmPeer::move_on_grid(int64_t step, int64_t place, int64_t keys, int64_t group) {
  if (cfg_.group_size <= 0 || coordinates_stay()) return;
  // Coordinates stay once two rounds in a row dealt them from full groups: then each key of the second
  // round took one member of each group of the first, and each row one of each column. Past M x M peers
  // (more keys than a group holds) the deals do not fill the rows evenly, and they go on (Note [A grid
  // whose coordinates stay]).
  if (keys > 0 && keys <= cfg_.group_size && group >= cfg_.group_size) {
    dealt_coordinates_ = last_dealt_step_ == step - 1 ? dealt_coordinates_ + 1 : 1;
    last_dealt_step_ = step;
    grid_keys_ = keys;
  } else {
    dealt_coordinates_ = 0;
  }
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
  if (cfg_.group_size <= 0 || coordinates_stay()) return;
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

// Note [A grid whose coordinates stay]
// With swarm.grid=dealt (the default) a round's leader deals its members over the next round's keys and
// tells every live peer where each goes (Note [A leader deals its groups over the next round's keys] in
// p2p/Matchmaking.cpp): N / M deal frames a peer a step, and every peer holds every record, since any
// peer may come to its key. Moshpit SGD's own grid keeps each peer's coordinates: a peer's group in round
// r + 2 is its group of round r, so the peers it will average with are the peers it has averaged with,
// and nobody needs telling. With swarm.grid=fixed a peer keeps its coordinates once leaders have dealt it
// both, in its first two rounds with company (the deals as before: the first round's one key of every
// peer dealt round-robin gives each next key one member of each group, and the second does the same the
// other way, so 64 peers in groups of 8 fill an 8 x 8 grid, each row and column once: two rounds in a
// row, each of full groups, or it goes on being dealt). Its record then
// says so (PeerRecord::grid), and from it every peer reads its key for any step (p2p::fixed_key_at):
// a leader waits only for the peers one step behind that come to its key, deals nobody whose
// coordinates stay, and a change of step goes to the peers that share a coordinate (Directory::Reach::
// kGrid), which are the peers of its next two rounds. Its heartbeat goes to those peers, to the peers
// whose coordinates are still dealt, and to the few it passes records on to; the others' records of it
// expire, and it keeps records of a bounded set: about 2 (M - 1) peers and the gossip's few, not N. No
// peer sees everyone, and the leaders still agree: a key's leader is the smallest key among its ready
// peers (Note [Matchmaking]), and the peers of a key share a coordinate, so each holds all the others'
// records.
// Mixing: on the full grid a round along the rows and the next along the columns give every peer the
// average of all in two rounds, and the two after that keep it there; with more peers than M x M the
// grid is partly filled (a cell of 32 peers in groups of 8 holds two, rows and columns of 8 still each
// meet every other). Past M x M peers the grid has more keys than a group holds, and the second round's
// deals, each a column's M members over M of the G rows from a start of its own, leave rows uneven (some
// of one peer, alone at every other round): there the coordinates are dealt anew each round, as with
// swarm.grid=dealt, and swarm.group_size of at least the square root of the swarm keeps them. A peer
// that no leader dealt yet (a newcomer, among peers whose coordinates stay)
// takes the row and the column that the fewest live peers it knows hold (settle_on_grid), and stays
// there (one of the emptiest by its key, so that peers settling at once spread). Its target batch counts
// the swarm as its key's live peers times the keys: its leader counts its mates alone (Note [The target
// batch counted in the key and scaled to the swarm] in SwarmProgress.cpp). What it gives up: the groups
// no longer even out as peers leave or as a start that was uneven left them (a row that lost a peer averages
// in 7 until a newcomer takes the place), and a swarm that grows far past its first rounds' size keeps
// their key count (its groups split: Note [Groups on a grid]).
bool SwarmPeer::coordinates_stay() const {
  return cfg_.group_size > 0 && cfg_.grid == "fixed" && dealt_coordinates_ >= 2;
}

uint64_t SwarmPeer::grid_word() const { return coordinates_stay() ? p2p::grid_word(grid_[0], grid_[1]) : 0; }

void SwarmPeer::settle_on_grid() {
  if (cfg_.group_size <= 0 || cfg_.grid != "fixed" || coordinates_stay()) return;
  std::map<uint64_t, int64_t> columns, rows;  // live peers per coordinate, among those whose coordinates stay
  for (const auto& p : directory_->peers()) {
    if (!p2p::grid_fixed(p) || p.leaving) continue;
    const auto c = p2p::grid_coordinates(p);
    ++columns[c[0]];
    ++rows[c[1]];
  }
  if (rows.empty()) return;  // the first rounds deal it, as everyone
  // Of the rows (columns) the fewest hold, one by this peer's key: peers that settle at once, with one view
  // of the grid, spread over its holes rather than all taking the first.
  const auto& key = identity_.token.peer_public_key;
  const auto fewest = [&](const std::map<uint64_t, int64_t>& held, size_t salt) {
    int64_t least = held.begin()->second;
    for (const auto& [c, n] : held) least = std::min(least, n);
    std::vector<uint64_t> emptiest;
    for (const auto& [c, n] : held)
      if (n == least) emptiest.push_back(c);
    return emptiest[(uint64_t{key[salt]} << 8 | key[salt + 1]) % emptiest.size()];
  };
  grid_ = {fewest(columns, 0), fewest(rows, 2)};
  grid_keys_ = static_cast<int64_t>(std::max(columns.rbegin()->first, rows.rbegin()->first)) + 1;
  dealt_coordinates_ = 2;
}

// A live peer of an earlier release reads no deal: it learns a change of step only from the change itself.
bool SwarmPeer::all_take_deals() const { return all_take_deals(directory_->peers()); }

bool SwarmPeer::all_take_deals(const std::vector<p2p::PeerRecord>& peers) {
  return std::all_of(peers.begin(), peers.end(),
                     [](const p2p::PeerRecord& p) { return (p.features & p2p::PeerRecord::kTakesDeals) != 0; });
}

}  // namespace cohort::parallel::swarm

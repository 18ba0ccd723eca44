// A swarm peer's place on the grid of groups (Note [Groups on a grid] in p2p/Matchmaking.cpp): the group
// key it announces for a step, where its round's leader deals it next, the smallest group a lone peer
// joins, and whether every live peer reads the leaders' deals (Note [A leader deals its groups over the
// next round's keys]). The rest of the peer is parallel/swarm/SwarmPeer.cpp's.
#include <algorithm>
#include <map>
#include <vector>

#include "cohort/p2p/Averager.h"
#include "cohort/parallel/swarm/SwarmPeer.h"

namespace cohort::parallel::swarm {
uint64_t SwarmPeer::group_key_for(int64_t step) const {
  if (cfg_.group_size <= 0) return 0;
  return p2p::grid_key_at(grid_, step);
}

// The next round's key is the coordinate this round sets (p2p::next_group_key, the leader's deal); a peer
// whose leader did not say how many keys it dealt over counts them itself.
void SwarmPeer::move_on_grid(int64_t step, int64_t place, int64_t keys, int64_t moved) {
  if (cfg_.group_size <= 0) return;
  if (coordinates_stay()) {
    if (moved >= 0) split_off(step, static_cast<uint64_t>(moved));
    return;
  }
  if (keys <= 0) keys = p2p::grid_keys(static_cast<int64_t>(directory_->peers().size() + 1), cfg_.group_size);
  const uint64_t next = p2p::next_group_key(group_key_for(step), static_cast<uint64_t>(step), place, keys);
  grid_[static_cast<size_t>(step % 2)] = p2p::key_coordinate(next);
}

// Note [An overfull key splits] (p2p/Matchmaking.cpp): its leader moved it to a new key of this round's
// dimension. Its next record goes to everyone: the peers of the key it left hold its record there, and a
// leader of that key would wait for it.
void SwarmPeer::split_off(int64_t step, uint64_t moved) {
  const auto d = static_cast<size_t>(1 - step % 2);
  const uint64_t left = grid_[d];
  grid_[d] = moved;
  grid_told_everyone_ = false;
  log("swarm: step " + std::to_string(step + 1) + ": its " + (d == 0 ? "column" : "row") + " (" + std::to_string(left) +
      ") held more ready peers than swarm.group_size, and split: coordinates stay at column " +
      std::to_string(grid_[0]) + ", row " + std::to_string(grid_[1]) + " (moved)");
}

// Once a run: a swarm.grid=fixed peer among peers that are dealt, so that a run set up to keep its
// coordinates and which does not says why.
void SwarmPeer::warn_grid_not_formed(const p2p::PeerRecord& other) {
  if (warned_grid_) return;
  warned_grid_ = true;
  log("swarm: the grid's coordinates are dealt each round, not kept (swarm.grid=fixed): peer " +
      p2p::peer_name(other.key) + " at " + other.address +
      " does not keep them (it runs swarm.grid=dealt, or an earlier release). Set swarm.grid the same on every "
      "peer; this one keeps its coordinates once no such peer is live");
}

void SwarmPeer::log_coordinates(int64_t step, const char* how) const {
  log("swarm: step " + std::to_string(step) + ": coordinates stay at column " + std::to_string(grid_[0]) + ", row " +
      std::to_string(grid_[1]) + " of " + std::to_string(grid_keys_) + " (" + how + ")");
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
  grid_[1 - d] = p2p::key_coordinate(best);
}

// Note [A grid whose coordinates stay]
// With swarm.grid=dealt (the default) a round's leader deals its members over the next round's keys and
// tells every live peer where each goes (Note [A leader deals its groups over the next round's keys] in
// p2p/Matchmaking.cpp): N / M deal frames a peer a step, and every peer holds every record, since any peer
// may come to its key. Moshpit SGD's own grid keeps each peer's coordinates: a peer's group in round
// r + 2 is its group of round r, so the peers it will average with are the peers it has averaged with,
// and nobody needs telling. With swarm.grid=fixed the first two rounds are dealt, as by default, while
// the peers meet; at step 2 (kGridForms) the grid forms: each peer takes the cell of its key's rank among
// the live peers it knows (p2p::grid_cell), on a grid of G = grid_keys(N, M) keys a side, as leaders
// count them. Ranks fill the rows and the columns evenly, give or take one, and 64 peers in groups of 8
// make the 8 x 8 grid, each cell once, whatever the first rounds were. (A first build kept the cells that
// two rounds in a row of full groups dealt a peer, and settled the others on the emptiest rows: with
// swarm.sampler=random peers turn ready at different times, the first rounds were seldom full, 60 of 64
// peers settled at once on views that each of their settlings changed, and rows of 9 and 10 split into
// groups of 4 and 5 to the end.) The rank needs only the set of live peers, which every peer knows by
// then (each holds every record until its coordinates stay), and not who has formed already.
// Its record then says so (PeerRecord::grid), and that record, and its first change of step after, go to
// everyone: a peer that shares no coordinate with it holds its record from before, which names another key
// and no grid, and a leader of that key waited for it there until the record expired (seen: 24 of 32
// peers held at step 4 for 40 steps, while the other row went on in pairs). From the record every peer
// reads its key for any step (p2p::fixed_key_at): a leader waits only for the peers one step behind that come to its
// key, and for a peer on its step about to form (PeerRecord::kFormsGrid, its coordinates still dealt, not ready: its
// record names its dealt key until it forms; without the wait, groups of 1 to 7 at steps 3 to 8) where its
// rank among the peers this one formed with puts it on this key (p2p::Averager::grid_formed: waiting for
// every such peer held DiLoCo's whole rows, 1.74 s a round where the dealt grid took 0.46), deals
// nobody whose coordinates stay, and a change of step goes to the peers that share a coordinate
// (Directory::Reach::kGrid), which are the peers of its next two rounds. Its heartbeat goes to those
// peers, to the peers whose coordinates are still dealt, and to the few it passes records on to; the
// others' records of it expire, and it keeps records of a bounded set: about 2 (M - 1) peers and the
// gossip's few, not N. No peer sees everyone, and the leaders still agree: a key's leader is the smallest
// key among its ready peers (Note [Matchmaking]), and the peers of a key share a coordinate, so each holds
// all the others' records.
// Mixing: on the full grid a round along the rows and the next along the columns give every peer the
// average of all in two rounds, and the two after that keep it there; with more peers than G x G a cell
// holds several (32 peers in groups of 8: G = 4, two a cell), and rows and columns still each meet
// every other. Past M x M peers at step 2 the grid has more keys than a group holds: there the coordinates
// are dealt anew each round, as with swarm.grid=dealt, and swarm.group_size of at least the square root of
// the swarm keeps them. A peer that comes after the grid formed (a newcomer, or one whose state download
// carried it past step 2) takes a hole: in the order of the keys of the peers settling with it, each
// takes the column and the row the most live peers hold short of a group (p2p::settle_coordinate), so 8
// newcomers at once fill the 8 places the dead left, and peers that come one at a time fill one key at a
// time. Where every key is whole, they make one overfull, and its leader moves a group's worth to a new
// key (Note [An overfull key splits] in p2p/Matchmaking.cpp): the grid grows with the swarm, to the size
// it would have formed at (16 peers doubled: 4 x 4). Its target batch counts the swarm as its key's live
// peers times the keys along its dimension: its leader counts its mates alone (Note [The target batch
// counted in the key and scaled to the swarm] in SwarmProgress.cpp). What it gives up: the groups no
// longer even out as peers leave (a row that lost a peer averages in 7 until a newcomer takes the place;
// keys never merge), a newcomer that comes while the dead peers' records live takes a place in a full row
// (which then splits), and a key one past a group (9 in groups of 8) splits no one off, since that one
// would average alone: it averages in 4 and 5 beside a key of 7 until newcomers come (seen once, where
// newcomers settled while keys split).
bool SwarmPeer::coordinates_stay() const { return cfg_.group_size > 0 && cfg_.grid == "fixed" && coordinates_stay_; }

uint64_t SwarmPeer::grid_word() const { return coordinates_stay() ? p2p::grid_word(grid_[0], grid_[1]) : 0; }

// Only the peers heard from lately, by this peer's clock (PeerRecord::taken_unix): a record lives its TTL
// and the DHT's put gap past its writing, which on this machine's fault runs was most of a minute, and a
// census that counted the killed peers that long showed no key short (8, 8, 8 and 8 where 6, 5, 5 and 8
// lived), so an overfull key's leader opened new keys and the dead peers' places stayed empty. A live mate
// sends a new record at each change of step, and its heartbeat renews it within the TTL: twice
// swarm.peer_ttl_s leaves room for both.
uint64_t SwarmPeer::census() const {
  if (!coordinates_stay()) return 0;
  const double heard_since = p2p::detail::unix_now() - 2 * cfg_.peer_ttl_s;
  int64_t column = 1, row = 1;
  for (const auto& p : directory_->peers()) {
    if (p.leaving || !p2p::grid_fixed(p) || p.taken_unix < heard_since) continue;
    const auto c = p2p::grid_coordinates(p);
    column += c[0] == grid_[0], row += c[1] == grid_[1];
  }
  return p2p::grid_census(column, row);
}

namespace {
// How many live peers hold each coordinate `d` of the grid: those this peer knows there, or as many as one
// of them counts there (PeerRecord::census), if more: a newcomer knows the peers that passed it records,
// not every one.
std::vector<int64_t> held_counts(const std::vector<p2p::PeerRecord>& fixed, size_t d) {
  std::vector<int64_t> known;
  for (const auto& p : fixed) {
    const auto c = static_cast<size_t>(p2p::grid_coordinates(p)[d]);
    if (c >= p2p::kMaxGridKeys) continue;
    if (c >= known.size()) known.resize(c + 1, 0);
    ++known[c];
  }
  for (const auto& [c, n] : p2p::census_along(fixed, d))
    if (c < known.size()) known[c] = std::max(known[c], n);
  return known;
}
}  // namespace

bool SwarmPeer::settle_on_grid(int64_t step) {
  if (cfg_.group_size <= 0 || cfg_.grid != "fixed" || coordinates_stay() || step < kGridForms) return false;
  // The live peers whose coordinates stay, and the live peers whose coordinates are still dealt, this one
  // among them.
  std::vector<p2p::PeerRecord> fixed;
  std::vector<p2p::PeerKey> live{identity_.token.peer_public_key}, settling{identity_.token.peer_public_key};
  for (const auto& p : directory_->peers()) {
    if (p.leaving) continue;
    // A live peer that would not keep its coordinates: its leaders would deal this one; all stay dealt.
    if (!(p.features & p2p::PeerRecord::kFormsGrid) && !p2p::grid_fixed(p)) {
      warn_grid_not_formed(p);
      return false;
    }
    live.push_back(p.key);
    if (!p2p::grid_fixed(p)) {
      settling.push_back(p.key);
      continue;
    }
    fixed.push_back(p);
  }
  if (step == kGridForms || fixed.empty()) {
    // The grid forms: each live peer takes the cell of its key's rank, whoever settled already.
    const auto keys = p2p::grid_keys(static_cast<int64_t>(live.size()), cfg_.group_size);
    if (keys > cfg_.group_size) return false;  // past M x M peers: dealt each round
    std::sort(live.begin(), live.end());
    const auto rank = std::find(live.begin(), live.end(), identity_.token.peer_public_key) - live.begin();
    grid_ = p2p::grid_cell(rank, keys);
    averager_->grid_formed(live, keys);
    grid_keys_ = keys;
    coordinates_stay_ = true;
    log_coordinates(step, "formed");
    return true;
  }
  // A peer that comes later takes a hole: in their keys' order, so that peers settling at once, with one
  // view of the grid, fill its holes rather than all taking the emptiest. The keys of each dimension: as
  // many as the coordinates held show (an empty column counts). Not more, though the swarm has grown: a
  // row of newcomers alone would meet the old peers only through its columns, and where the keys fill past
  // a group they split (Note [An overfull key splits] in p2p/Matchmaking.cpp).
  const auto columns_held = held_counts(fixed, 0), rows_held = held_counts(fixed, 1);
  std::sort(settling.begin(), settling.end());
  const auto place = static_cast<size_t>(std::find(settling.begin(), settling.end(), identity_.token.peer_public_key) -
                                         settling.begin());
  // Rows in the other order: peers that settle at once take different cells, not one cell's column and row.
  grid_ = {p2p::settle_coordinate(columns_held, place, cfg_.group_size),
           p2p::settle_coordinate(rows_held, settling.size() - 1 - place, cfg_.group_size)};
  grid_keys_ = static_cast<int64_t>(std::max(columns_held.size(), rows_held.size()));
  coordinates_stay_ = true;
  log_coordinates(step, "settled");
  return true;
}

// A live peer of an earlier release reads no deal: it learns a change of step only from the change itself.
bool SwarmPeer::all_take_deals() const { return all_take_deals(directory_->peers()); }

bool SwarmPeer::all_take_deals(const std::vector<p2p::PeerRecord>& peers) {
  return std::all_of(peers.begin(), peers.end(),
                     [](const p2p::PeerRecord& p) { return (p.features & p2p::PeerRecord::kTakesDeals) != 0; });
}

}  // namespace cohort::parallel::swarm

// Matchmaking on a grid whose coordinates stay (Note [A grid whose coordinates stay] in
// parallel/swarm/SwarmGrid.cpp): where a peer still about to form will be (the roster of the grid's
// forming), and where a leader moves the peers of a key that holds more than a group (Note [An overfull
// key splits]). The rest of matchmaking is Matchmaking.cpp's.
#include <algorithm>
#include <map>

#include "cohort/p2p/Averager.h"

namespace cohort::p2p {

std::optional<uint64_t> Roster::key_at(const PeerKey& key, int64_t round) const {
  const auto at = std::lower_bound(peers.begin(), peers.end(), key);
  if (keys <= 0 || at == peers.end() || *at != key) return std::nullopt;
  return grid_key_at(grid_cell(at - peers.begin(), keys), round);
}

void Averager::grid_formed(std::vector<PeerKey> roster, int64_t keys) {
  std::sort(roster.begin(), roster.end());
  roster_ = {std::move(roster), keys};
}

// Note [An overfull key splits]
// Where coordinates stay (Note [A grid whose coordinates stay] in parallel/swarm/SwarmGrid.cpp) the grid
// had the keys it formed or settled with, for good: a swarm that grew past that kept its key count, and
// its keys held more peers than a group. Newcomers that doubled 16 peers on a 2 x 2 grid of groups of 8
// made rows of 16, which split into groups of 5 to 8 at every round to the end, each peer holding 23
// records, and a round took up to 3.78 s (bench/scale.py --faults 16:8:0:16); a swarm started by 2 peers
// had one key, whose leader waited for every peer. So a leader whose coordinates stay, with more ready
// peers on its key than a group holds (M), keeps the first M in its round's order on the key and moves
// the rest: first to the other keys of the dimension that hold fewer than M, the fullest first, each up to
// M, as its mates count them (each record carries the peers on its column and row, PeerRecord::census,
// and a leader's row spans the columns); then, where 2 or more (swarm.min_group_size) remain, to new keys,
// M to a key (the last takes the remainder): the k-th to coordinate c + k A of this round's dimension,
// where c is the key's coordinate and A the keys the leader sees along it (p2p::grid_keys_along). It says
// so in each group message, member by member; the round's groups are as they would be, of nearly equal
// size. New coordinates do not take old ones: each is past the largest the leader sees, and keys that
// split at once with one A take distinct ones (c < A). The other coordinate stays, so the movers still
// meet their rows (or columns): the grid gains keys, and its rows still meet every column. The leader's
// decision is one for all its members, so no two views need agree; a mover's next record goes to
// everyone, as where its coordinates first stayed, and its next round on that dimension is two steps
// away. Doubled, 16 peers of 4 a cell on 2 x 2 become the 4 x 4 grid that 32 peers form, in two rounds.
// Why M stay, not half: newcomers take the keys the most hold short of a group, so a swarm that grows one
// peer at a time fills the key that split off and keeps the others whole, where halves would leave every
// key between M / 2 and M (measured first: a swarm doubled by newcomers that came over 13 steps split into
// 6 columns of 5 or 6). Why the short keys first: one peer past M would average alone on a key of its own,
// and a key of 9 in groups of 8 (4 and 5 each round) stayed beside a key of 7 where newcomers settled
// while keys split. Keys never merge: a key that lost peers averages short until newcomers or an overfull
// key's extra peers fill it.
std::vector<uint64_t> split_moves(uint64_t key, const Split& split, const std::map<uint64_t, int64_t>& short_keys) {
  const int64_t m = split.group_size, n = split.ready;
  std::vector<uint64_t> moves(static_cast<size_t>(std::max<int64_t>(n, 0)), 0);
  if (split.along <= 0 || m <= 0 || n <= m) return moves;
  int64_t place = m;  // the first M stay
  // The fullest of the keys short of a group first, each up to a group.
  std::vector<std::pair<uint64_t, int64_t>> fullest(short_keys.begin(), short_keys.end());
  std::stable_sort(fullest.begin(), fullest.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  for (const auto& [coordinate, peers] : fullest)
    for (int64_t room = m - peers; room > 0 && place < n && coordinate < kMaxGridKeys; --room)
      moves[static_cast<size_t>(place++)] = coordinate + 1;
  // The rest to new keys, a group's worth each, the last with the remainder; too few to average stay.
  const int64_t rest = n - place;
  if (rest < split.fewest) return moves;
  const int64_t chunks = std::max<int64_t>(1, rest / m);
  for (int64_t p = place; p < n; ++p) {
    const int64_t k = std::min(chunks, 1 + (p - place) / m);
    const uint64_t coordinate = key_coordinate(key) + static_cast<uint64_t>(split.along * k);
    if (coordinate < kMaxGridKeys) moves[static_cast<size_t>(p)] = coordinate + 1;
  }
  return moves;
}

// The leader's view for split_moves: the keys along this round's dimension, and the others short of a
// group, as the mates that hold them count them (the most any says: a count from before a peer left
// overstates, and moves fewer).
std::vector<uint64_t> Averager::plan_split(uint64_t round, uint64_t group_key, int64_t ready,
                                           const std::vector<PeerRecord>& peers) const {
  const auto d = static_cast<size_t>(1 - round % 2);
  const uint64_t mine = key_coordinate(group_key);
  const auto m = options_.group_size;
  std::map<uint64_t, int64_t> short_keys;
  for (const auto& [c, n] : census_along(peers, d))
    if (c != mine && n < m) short_keys[c] = n;
  const Split split{grid_keys_along(peers, mine, static_cast<int64_t>(round)), ready, m,
                    std::max<int64_t>(2, options_.min_group_size)};
  return split_moves(group_key, split, short_keys);
}

}  // namespace cohort::p2p

// The grid whose coordinates stay as its leaders grow it (p2p/MatchmakingGrid.cpp): the moves of an
// overfull key's peers, simulated round after round with the leaders' own rules (split_moves,
// grid_keys_along, the census), the newcomers' places (settle_coordinate), and the roster of the forming.
// Pure: no sockets.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <iostream>
#include <map>
#include <random>
#include <vector>

#include "cohort/p2p/Averager.h"

namespace cohort::p2p {
namespace {

#if COHORT_HAVE_SWARM

// The peers on each coordinate `d` (0: the columns).
std::map<uint64_t, int64_t> peers_per(const std::vector<PeerRecord>& peers, size_t d) {
  std::map<uint64_t, int64_t> n;
  for (const auto& p : peers) ++n[grid_coordinates(p)[d]];
  return n;
}

// Each peer's census (PeerRecord::census): the peers on its column and on its row.
void count_census(std::vector<PeerRecord>& peers) {
  const auto columns = peers_per(peers, 0), rows = peers_per(peers, 1);
  for (auto& p : peers) {
    const auto c = grid_coordinates(p);
    p.census = grid_census(columns.at(c[0]), rows.at(c[1]));
  }
}

// Leaders on a grid whose coordinates stay, as send_groups decides, round after round: each key's ready
// peers in groups of at most `m`, and the peers past the first m moved (split_moves, on the keys the
// leader sees along the dimension and the keys short of a group its mates count: the peers of its row and
// column). Every peer is ready. Returns the mean group of the rounds run.
double leaders_split(std::vector<PeerRecord>& peers, int64_t m, int64_t first_round, int64_t rounds) {
  int64_t members = 0, groups_formed = 0;
  for (int64_t round = first_round; round < first_round + rounds; ++round) {
    count_census(peers);
    const auto d = static_cast<size_t>(1 - round % 2);
    std::map<uint64_t, std::vector<size_t>> by_key;
    for (size_t i = 0; i < peers.size(); ++i) by_key[fixed_key_at(peers[i], round)].push_back(i);
    std::mt19937 order(static_cast<uint32_t>(round));  // the leader's order, shuffled each round
    for (auto& [key, on_key] : by_key) std::shuffle(on_key.begin(), on_key.end(), order);
    std::vector<PeerRecord> after = peers;
    for (const auto& [key, on_key] : by_key) {
      const auto& leader = peers[on_key.front()];
      const auto mine = grid_coordinates(leader)[d];
      std::vector<PeerRecord> seen;  // the leader's view: its row's and its column's peers
      std::map<uint64_t, int64_t> short_keys;
      for (const auto& p : peers)
        if (grid_mates(p, leader)) {
          seen.push_back(p);
          if (grid_coordinates(p)[d] != mine && census_of(p, d) < m)
            short_keys[grid_coordinates(p)[d]] = census_of(p, d);
        }
      const auto n = static_cast<int64_t>(on_key.size()), groups = group_count(n, m, 2);
      const Split split{grid_keys_along(seen, mine, round), n, m, 2};
      const auto moves = split_moves(key, split, short_keys);
      for (int64_t place = 0; place < n; ++place) {
        auto c = grid_coordinates(peers[on_key[static_cast<size_t>(place)]]);
        if (moves[static_cast<size_t>(place)] > 0) c[d] = moves[static_cast<size_t>(place)] - 1;
        after[on_key[static_cast<size_t>(place)]].grid = grid_word(c[0], c[1]);
      }
      members += n, groups_formed += groups;
    }
    peers = after;
  }
  count_census(peers);
  return static_cast<double>(members) / static_cast<double>(groups_formed);
}

// Note [An overfull key splits]: 16 peers formed a 2 x 2 grid in groups of 8 (4 a cell), and 16 newcomers
// took the same cells (8 a cell: rows and columns of 16). Two rounds later the grid is the size 32 peers
// form: 4 x 4, every row and every column 8, and the groups of every round after are of 8.
TEST(SwarmGrid, AKeyWithMoreReadyPeersThanAGroupSplitsAndTheDoubledSwarmMakesTheGridOfItsSize) {
  std::vector<PeerRecord> peers(32);
  for (size_t i = 0; i < peers.size(); ++i) {
    const auto cell = grid_cell(static_cast<int64_t>(i % 16), 2);
    peers[i].grid = grid_word(cell[0], cell[1]);
  }
  leaders_split(peers, 8, 4, 2);
  for (const size_t d : {0, 1})
    EXPECT_EQ(peers_per(peers, d), (std::map<uint64_t, int64_t>{{0, 8}, {1, 8}, {2, 8}, {3, 8}})) << "dimension " << d;
  std::map<std::array<uint64_t, 2>, int> cells;
  for (const auto& p : peers) ++cells[grid_coordinates(p)];
  // Which peers move is the leader's shuffled order, so the cells are not all 2: the rows still meet
  // nearly every column (here 15 of the 16 cells are held).
  EXPECT_GE(cells.size(), 12u);
  EXPECT_EQ(leaders_split(peers, 8, 6, 4), 8.0) << "keys split again, or groups came short";
}

// Note [A grid whose coordinates stay]: a leader whose coordinates stay reads where a peer still about to
// form will be from the roster of the grid's forming, the key that peer names once its record says so,
// and nothing for a peer the roster does not hold (it waits for that one as before).
TEST(SwarmGrid, TheRosterOfTheFormingNamesEachPeersKeyAsItsCoordinatesWill) {
  std::vector<PeerKey> keys(8);
  for (size_t i = 0; i < keys.size(); ++i) keys[i][0] = static_cast<uint8_t>(200 - 10 * i);  // out of order
  Roster roster{keys, 2};
  std::sort(roster.peers.begin(), roster.peers.end());
  for (size_t rank = 0; rank < roster.peers.size(); ++rank) {
    PeerRecord formed;
    const auto cell = grid_cell(static_cast<int64_t>(rank), 2);
    formed.grid = grid_word(cell[0], cell[1]);
    for (const int64_t round : {3, 4}) EXPECT_EQ(roster.key_at(roster.peers[rank], round), fixed_key_at(formed, round));
  }
  PeerKey stranger{};
  stranger[0] = 1;
  EXPECT_FALSE(roster.key_at(stranger, 3));
  EXPECT_FALSE(Roster{}.key_at(keys[0], 3)) << "no grid formed: no roster";
}

// A key one past a group (9 in groups of 8) cannot split off a key of its own, whose one peer would average
// alone; its leader reads from its mates' census which keys are short and hands its extra peer to the
// fullest: columns of 9, 9, 7 and 7 (seen where newcomers settled while keys split) even out to 8 each.
TEST(SwarmGrid, AKeyOnePastAGroupHandsItsExtraPeerToAKeyItsMatesCountShort) {
  std::vector<PeerRecord> peers;
  for (const auto& [column, n] : std::vector<std::pair<uint64_t, int>>{{0, 9}, {1, 9}, {2, 7}, {3, 7}})
    for (int i = 0; i < n; ++i) {
      PeerRecord p;
      p.grid = grid_word(column, peers.size() % 4);
      peers.push_back(p);
    }
  leaders_split(peers, 8, 4, 6);
  EXPECT_EQ(peers_per(peers, 0), (std::map<uint64_t, int64_t>{{0, 8}, {1, 8}, {2, 8}, {3, 8}}));
  EXPECT_EQ(peers_per(peers, 1), (std::map<uint64_t, int64_t>{{0, 8}, {1, 8}, {2, 8}, {3, 8}}));
  EXPECT_EQ(leaders_split(peers, 8, 10, 2), 8.0);
}

// A swarm started by 2 peers (one key) that newcomers join one at a time, each taking the column and the
// row the most hold short of a group (settle_coordinate): keys split as they pass a group, and at 64 peers in groups of
// 8 no key holds more than a group and most hold a whole one; no two splits of a round took one coordinate.
TEST(SwarmGrid, ASwarmThatGrowsOnePeerAtATimeKeepsItsKeysWithinAGroup) {
  std::vector<PeerRecord> peers(2);
  for (auto& p : peers) p.grid = grid_word(0, 0);
  int64_t round = 2;
  while (peers.size() < 64) {
    std::vector<uint64_t> columns, rows;
    for (const auto& p : peers) columns.push_back(grid_coordinates(p)[0]), rows.push_back(grid_coordinates(p)[1]);
    const auto keys = [](const std::vector<uint64_t>& held) {
      return static_cast<int64_t>(*std::max_element(held.begin(), held.end())) + 1;
    };
    PeerRecord newcomer;
    newcomer.grid =
        grid_word(settle_coordinate(columns, keys(columns), 0, 8), settle_coordinate(rows, keys(rows), 0, 8));
    peers.push_back(newcomer);
    leaders_split(peers, 8, round, 2);
    round += 2;
  }
  const double mean = leaders_split(peers, 8, round, 2);
  for (const size_t d : {0, 1})
    for (const auto& [coordinate, n] : peers_per(peers, d)) EXPECT_LE(n, 8) << "dimension " << d << ": " << coordinate;
  std::cout << "64 peers that came one at a time: mean group " << mean << "; columns";
  for (const auto& [c, n] : peers_per(peers, 0)) std::cout << " " << n;
  std::cout << "; rows";
  for (const auto& [c, n] : peers_per(peers, 1)) std::cout << " " << n;
  std::cout << "\n";
  EXPECT_GE(mean, 6.0);
}

#endif  // COHORT_HAVE_SWARM

}  // namespace
}  // namespace cohort::p2p

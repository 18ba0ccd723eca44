// A peer's record and the kRecord body in bytes (p2p/PeerRecord.cpp): what is written reads back, a
// record speaks only for the peer that sealed it, a record of an earlier release reads with the
// appended fields at their defaults, and a body cut short yields the records before the cut.
#include <gtest/gtest.h>

#include <array>
#include <map>
#include <set>
#include <vector>

#include "cohort/p2p/Directory.h"
#include "cohort/p2p/Wire.h"

namespace cohort::p2p {
namespace {

PeerRecord every_field_set() {
  PeerRecord r;
  for (size_t i = 0; i < r.key.size(); ++i) r.key[i] = static_cast<uint8_t>(i + 1);
  r.address = "127.0.0.12:29500";
  r.step = 41, r.samples = 384, r.samples_per_s = 1250.5;
  r.ready = true, r.leaving = true;
  r.written_unix = 1.78e9;
  r.group_size = 7, r.digest_step = 40, r.digest = 0x0123456789abcdefULL;
  r.session = 99, r.started_unix = 1.77e9;
  r.group_key = 5, r.features = PeerRecord::kPairFrames | PeerRecord::kPolyPairFrames;
  r.grid = grid_word(3, 6);
  r.census = grid_census(9, 7);
  return r;
}

TEST(SwarmRecord, EveryFieldReadsBackAndOnlyForItsSigner) {
  const auto r = every_field_set();
  const auto back = detail::decode_record(detail::encode_record(r), r.key);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->key, r.key);
  EXPECT_EQ(back->address, r.address);
  EXPECT_EQ(back->step, r.step);
  EXPECT_EQ(back->samples, r.samples);
  EXPECT_EQ(back->samples_per_s, r.samples_per_s);
  EXPECT_TRUE(back->ready);
  EXPECT_TRUE(back->leaving);
  EXPECT_EQ(back->written_unix, r.written_unix);
  EXPECT_EQ(back->group_size, r.group_size);
  EXPECT_EQ(back->digest_step, r.digest_step);
  EXPECT_EQ(back->digest, r.digest);
  EXPECT_EQ(back->session, r.session);
  EXPECT_EQ(back->started_unix, r.started_unix);
  EXPECT_EQ(back->group_key, r.group_key);
  EXPECT_EQ(back->features, r.features);
  EXPECT_EQ(back->grid, r.grid);
  EXPECT_EQ(census_of(*back, 0), 9);
  EXPECT_EQ(census_of(*back, 1), 7);
  PeerKey other = r.key;
  other[0] ^= 1;
  EXPECT_FALSE(detail::decode_record(detail::encode_record(r), other));
  auto cut = detail::encode_record(r);
  cut.resize(20);
  EXPECT_FALSE(detail::decode_record(cut, r.key));
}

TEST(SwarmRecord, AnEarlierReleasesRecordReadsWithTheAppendedFieldsAtTheirDefaults) {
  const auto r = every_field_set();
  // Version 1's fields alone: what a peer of the first release wrote.
  Writer w;
  w.u8(1).raw(r.key.data(), r.key.size()).str(r.address).i64(r.step).i64(r.samples).f64(r.samples_per_s);
  w.u8(1).u8(0).f64(r.written_unix);
  const auto back = detail::decode_record(w.take(), r.key);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->step, r.step);
  EXPECT_EQ(back->group_size, 0);
  EXPECT_EQ(back->digest_step, -1);
  EXPECT_EQ(back->session, 0u);
  EXPECT_EQ(back->group_key, 0u);
  EXPECT_EQ(back->features, 0u);
  EXPECT_EQ(back->grid, 0u);
  EXPECT_EQ(back->census, 0u);
  EXPECT_FALSE(grid_fixed(*back));
}

// Note [A grid whose coordinates stay] (parallel/swarm/SwarmGrid.cpp): a record whose coordinates stay names
// its key for any step, as the peer itself does (the rows on even steps, the columns on odd), and two such
// peers are mates when they share either coordinate; a record whose coordinates are dealt is nobody's mate.
TEST(SwarmRecord, CoordinatesThatStayNameTheKeyOfEveryStepAndTheMatesThatShareOne) {
  PeerRecord a, b, c, dealt;
  a.grid = grid_word(2, 5), b.grid = grid_word(2, 7), c.grid = grid_word(4, 7);
  EXPECT_TRUE(grid_fixed(a));
  // Even steps average along dimension 0, among the peers that share c1; odd steps among those sharing c0.
  EXPECT_EQ(fixed_key_at(a, 10), 1u + 5u);
  EXPECT_EQ(fixed_key_at(a, 11), 1u + (1ULL << 32) + 2u);
  EXPECT_EQ(fixed_key_at(b, 11), fixed_key_at(a, 11));
  EXPECT_NE(fixed_key_at(b, 10), fixed_key_at(a, 10));
  EXPECT_EQ(fixed_key_at(c, 10), fixed_key_at(b, 10));
  EXPECT_TRUE(grid_mates(a, b));
  EXPECT_TRUE(grid_mates(b, c));
  EXPECT_FALSE(grid_mates(a, c));
  EXPECT_FALSE(grid_mates(a, dealt));
  EXPECT_FALSE(grid_fixed(dealt));
}

// A leader that dealt a peer before its coordinates came to stay (its view of the peer was older) names a
// key the peer will not go to: matchmaking reads a peer whose record says its coordinates stay on its own
// step and key, and a peer whose coordinates are dealt where its deal sends it.
TEST(SwarmRecord, ADealMovesAPeerWhoseCoordinatesAreDealtAndNotOneWhoseCoordinatesStay) {
  PeerRecord dealt;
  dealt.step = 2, dealt.group_key = 7, dealt.dealt_step = 3, dealt.dealt_key = 9;
  EXPECT_EQ(as_dealt(dealt).step, 3);
  EXPECT_EQ(as_dealt(dealt).group_key, 9u);
  PeerRecord stays = dealt;
  stays.grid = grid_word(1, 0);
  EXPECT_EQ(as_dealt(stays).step, 2);
  EXPECT_EQ(as_dealt(stays).group_key, 7u);
}

// Peers that form a grid by their keys' ranks fill its rows and columns evenly, give or take one, each
// peer a cell of its own up to K x K peers: 64 peers in groups of 8 make the 8 x 8 grid.
TEST(SwarmRecord, PeersThatFormTheGridByRankFillEveryRowAndColumnEvenly) {
  for (const int64_t keys : {1, 2, 3, 8}) {
    for (int64_t peers = 1; peers <= 2 * keys * keys; ++peers) {
      std::map<uint64_t, int64_t> columns, rows;
      std::set<std::array<uint64_t, 2>> cells;
      for (int64_t rank = 0; rank < peers; ++rank) {
        const auto cell = grid_cell(rank, keys);
        ASSERT_LT(cell[0], static_cast<uint64_t>(keys));
        ASSERT_LT(cell[1], static_cast<uint64_t>(keys));
        ++columns[cell[0]], ++rows[cell[1]];
        cells.insert(cell);
      }
      const int64_t fewest = peers / keys, most = (peers + keys - 1) / keys;
      for (uint64_t c = 0; c < static_cast<uint64_t>(keys); ++c) {
        EXPECT_GE(columns[c], fewest) << peers << " peers, column " << c;
        EXPECT_LE(columns[c], most) << peers << " peers, column " << c;
        EXPECT_GE(rows[c], fewest) << peers << " peers, row " << c;
        EXPECT_LE(rows[c], most) << peers << " peers, row " << c;
      }
      EXPECT_EQ(static_cast<int64_t>(cells.size()), std::min(peers, keys * keys));
    }
  }
}

// A grid that lost 16 peers of columns 1 and 4 (48 keep columns 0, 2, 3, 5, 6 and 7), and 16 newcomers that
// settle at once in groups of 8: each taking the column the most hold short of a group, alone, all would
// take column 1; in their keys' order they fill the two empty columns, 8 each.
TEST(SwarmRecord, PeersThatSettleAtOnceFillTheGridsHolesEvenlyAnEmptyColumnAmongThem) {
  std::vector<uint64_t> held;
  for (const uint64_t column : {0, 2, 3, 5, 6, 7})
    for (int row = 0; row < 8; ++row) held.push_back(column);
  std::map<uint64_t, int> taken;
  for (size_t place = 0; place < 16; ++place) ++taken[settle_coordinate(held, 8, place, 8)];
  EXPECT_EQ(taken, (std::map<uint64_t, int>{{1, 8}, {4, 8}}));
  // Where the holes are fewer than the peers settling, they fill the fullest first (here to 4, in groups
  // of 4), and the rest take the fullest coordinate, which then splits (Note [An overfull key splits]).
  std::map<uint64_t, int> rows;
  for (size_t place = 0; place < 10; ++place) ++rows[settle_coordinate({0, 0, 1}, 3, place, 4)];
  EXPECT_EQ(rows, (std::map<uint64_t, int>{{0, 3}, {1, 3}, {2, 4}}));
  EXPECT_EQ(settle_coordinate({0, 0, 1}, 3, 9, 4), 0u) << "the tenth takes the first of the whole ones";
  // One newcomer among keys of 8, 5 and 7 in groups of 8: the 7, not the 5.
  std::vector<uint64_t> short_keys(8, 0);
  short_keys.insert(short_keys.end(), 5, 1);
  short_keys.insert(short_keys.end(), 7, 2);
  EXPECT_EQ(settle_coordinate(short_keys, 3, 0, 8), 2u);
  // A coordinate held past the keys the settling peer knows of is ignored, not read past the count.
  EXPECT_EQ(settle_coordinate({9}, 2, 0, 8), 0u);
}

TEST(SwarmRecord, ABodyCarriesItsRecordsInOrderAndOneCutShortYieldsThoseBeforeTheCut) {
  const std::vector<uint8_t> a{1, 2, 3}, b{}, c(300, 7);
  const auto body = detail::records_body({{a.data(), a.size()}, {b.data(), b.size()}, {c.data(), c.size()}});
  // The layout the previous release reads: a count, then each record's length and bytes.
  Writer expected;
  expected.u64(3).u64(a.size()).raw(a.data(), a.size()).u64(0).u64(c.size()).raw(c.data(), c.size());
  EXPECT_EQ(body, expected.take());
  const auto records = detail::sealed_records(body);
  ASSERT_EQ(records.size(), 3u);
  EXPECT_EQ(std::vector<uint8_t>(records[0].first, records[0].first + records[0].second), a);
  EXPECT_EQ(records[1].second, 0u);
  EXPECT_EQ(std::vector<uint8_t>(records[2].first, records[2].first + records[2].second), c);
  auto cut = body;
  cut.resize(cut.size() - 1);
  EXPECT_EQ(detail::sealed_records(cut).size(), 2u);
  EXPECT_TRUE(detail::sealed_records({}).empty());
  // No record at all where the first is cut short or the count is 0 (a refusal answers the first only).
  Writer short_first, none;
  short_first.u64(2).u64(5).raw(a.data(), a.size());
  none.u64(0).u64(a.size()).raw(a.data(), a.size());
  EXPECT_TRUE(detail::sealed_records(short_first.take()).empty());
  EXPECT_TRUE(detail::sealed_records(none.take()).empty());
}

}  // namespace
}  // namespace cohort::p2p

// A peer's record and the kRecord body in bytes (p2p/PeerRecord.cpp): what is written reads back, a
// record speaks only for the peer that sealed it, a record of an earlier release reads with the
// appended fields at their defaults, and a body cut short yields the records before the cut.
#include <gtest/gtest.h>

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

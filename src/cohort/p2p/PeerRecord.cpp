// A peer's record in bytes, the body of a kRecord frame that carries sealed records, and the body of a
// leader's kDeal frame: the one owner of these formats (the directory seals, sends, stores and opens
// records: p2p/Directory.cpp; matchmaking sends deals: p2p/Matchmaking.cpp). A record's fields are
// only ever appended, so a peer of an earlier release reads the fields it knows and ignores the rest.
#include <algorithm>
#include <array>
#include <chrono>

#include "cohort/p2p/PeerRecord.h"

#include "cohort/p2p/Directory.h"
#include "cohort/p2p/Wire.h"

namespace cohort::p2p::detail {

double unix_now() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

std::vector<uint8_t> encode_record(const PeerRecord& r) {
  Writer w;
  w.u8(1);  // the record's version: fields are only ever appended
  w.raw(r.key.data(), r.key.size()).str(r.address).i64(r.step).i64(r.samples).f64(r.samples_per_s);
  w.u8(r.ready ? 1 : 0).u8(r.leaving ? 1 : 0).f64(r.written_unix);
  w.i64(r.group_size);  // appended after version 1's fields: an older reader ignores it
  w.i64(r.digest_step).u64(r.digest);
  w.u64(r.session).f64(r.started_unix);
  w.u64(r.group_key);
  w.u64(r.features);
  w.u64(r.grid);
  w.u64(r.census);
  return w.take();
}

std::optional<PeerRecord> decode_record(const std::vector<uint8_t>& payload, const PeerKey& signer) {
  Reader r(payload);
  PeerRecord rec;
  const auto version = r.u8();
  r.raw(rec.key.data(), rec.key.size());
  rec.address = r.str();
  rec.step = r.i64();
  rec.samples = r.i64();
  rec.samples_per_s = r.f64();
  rec.ready = r.u8() != 0;
  rec.leaving = r.u8() != 0;
  rec.written_unix = r.f64();
  if (r.left() >= 8) rec.group_size = r.i64();
  if (r.left() >= 16) rec.digest_step = r.i64(), rec.digest = r.u64();
  if (r.left() >= 16) rec.session = r.u64(), rec.started_unix = r.f64();
  if (r.left() >= 8) rec.group_key = r.u64();
  if (r.left() >= 8) rec.features = r.u64();
  if (r.left() >= 8) rec.grid = r.u64();
  if (r.left() >= 8) rec.census = r.u64();
  // A record speaks for the peer that signed it only.
  if (!r.ok() || version < 1 || rec.key != signer) return std::nullopt;
  return rec;
}

std::vector<uint8_t> records_body(const std::vector<SealedRecord>& records) {
  Writer w;
  w.u64(records.size());
  for (const auto& [sealed, size] : records) w.u64(size).raw(sealed, size);
  return w.take();
}

std::vector<SealedRecord> sealed_records(const std::vector<uint8_t>& body) {
  Reader r(body);
  std::vector<SealedRecord> out;
  for (uint64_t n = r.u64(), i = 0; i < n && r.ok(); ++i) {
    const uint64_t size = r.u64();
    if (const uint8_t* sealed = r.take(size)) out.emplace_back(sealed, static_cast<size_t>(size));
  }
  return out;
}

std::vector<uint8_t> deal_body(const std::vector<Dealt>& dealt) {
  Writer w;
  w.u64(dealt.size());
  for (const auto& d : dealt) w.raw(d.key.data(), d.key.size()).u64(d.next_key);
  return w.take();
}

std::vector<Dealt> dealt_from(const std::vector<uint8_t>& body) {
  Reader r(body);
  const uint64_t n = r.u64();
  if (!r.ok() || n > 4096) return {};
  std::vector<Dealt> out(n);
  for (auto& d : out) {
    r.raw(d.key.data(), d.key.size());
    d.next_key = r.u64();
  }
  if (!r.ok()) return {};
  return out;
}

}  // namespace cohort::p2p::detail

namespace cohort::p2p {

namespace {
constexpr uint64_t kGridFixed = 1ULL << 63;
constexpr uint64_t kCoordinate = (1ULL << 31) - 1;
}  // namespace

uint64_t grid_word(uint64_t c0, uint64_t c1) { return kGridFixed | ((c0 & kCoordinate) << 32) | (c1 & kCoordinate); }

bool grid_fixed(const PeerRecord& p) { return (p.grid & kGridFixed) != 0; }

std::array<uint64_t, 2> grid_coordinates(const PeerRecord& p) {
  return {(p.grid >> 32) & kCoordinate, p.grid & kCoordinate};
}

uint64_t grid_key_at(const std::array<uint64_t, 2>& cell, int64_t step) {
  const auto d = static_cast<uint64_t>(step % 2);
  return 1 + (d << 32) + cell[1 - d];
}

uint64_t key_coordinate(uint64_t key) { return (key - 1) & 0xFFFFFFFFULL; }

uint64_t fixed_key_at(const PeerRecord& p, int64_t step) { return grid_key_at(grid_coordinates(p), step); }

uint64_t grid_census(int64_t column, int64_t row) {
  const auto clamp = [](int64_t n) { return static_cast<uint64_t>(std::clamp<int64_t>(n, 0, 0xFFFFFFFF)); };
  return (clamp(column) << 32) | clamp(row);
}

int64_t census_of(const PeerRecord& p, size_t d) {
  return static_cast<int64_t>(d == 0 ? p.census >> 32 : p.census & 0xFFFFFFFFULL);
}

std::map<uint64_t, int64_t> census_along(const std::vector<PeerRecord>& peers, size_t d) {
  std::map<uint64_t, int64_t> counted;
  for (const auto& p : peers)
    if (grid_fixed(p) && census_of(p, d) > 0) {
      auto& most = counted[grid_coordinates(p)[d]];
      most = std::max(most, census_of(p, d));
    }
  return counted;
}

bool grid_mates(const PeerRecord& a, const PeerRecord& b) {
  const auto x = grid_coordinates(a), y = grid_coordinates(b);
  return grid_fixed(a) && grid_fixed(b) && (x[0] == y[0] || x[1] == y[1]);
}

int64_t grid_keys_along(const std::vector<PeerRecord>& peers, uint64_t mine, int64_t step) {
  const auto d = static_cast<size_t>(1 - step % 2);
  uint64_t most = mine;
  for (const auto& p : peers)
    if (grid_fixed(p)) most = std::max(most, grid_coordinates(p)[d]);
  return static_cast<int64_t>(most) + 1;
}

// Rank i sits in row i mod K, and the i / K-th K peers each take every column once, shifted by i / K: a
// diagonal of the grid each, so that a part-filled last one spreads over the columns too.
std::array<uint64_t, 2> grid_cell(int64_t rank, int64_t keys) {
  const auto k = static_cast<uint64_t>(std::max<int64_t>(keys, 1)),
             i = static_cast<uint64_t>(std::max<int64_t>(rank, 0));
  return {(i % k + i / k) % k, i % k};
}

// In a fixed order, so that peers with one view of the grid that settle at once fill its holes (an empty
// column counts) and none takes one that another fills first. The fullest short of a group, not the
// emptiest: a swarm that grows one peer at a time then fills one key at a time, and where every key is
// whole the next peers make one key overfull, which splits a whole group off (Note [An overfull key
// splits] in p2p/Matchmaking.cpp). Taking the emptiest, every key grew to one past a group, split two off,
// and the 64th of peers that came one at a time found keys of 9, 9, 9, 8, 8, 7, 7 and 7 (mean group 5.8).
uint64_t settle_coordinate(const std::vector<uint64_t>& held, int64_t keys, size_t place, int64_t fill) {
  std::vector<int64_t> count(static_cast<size_t>(std::max<int64_t>(keys, 1)), 0);
  for (const auto c : held)
    if (c < count.size()) ++count[c];
  return settle_coordinate(std::move(count), place, fill);
}

uint64_t settle_coordinate(std::vector<int64_t> count, size_t place, int64_t fill) {
  if (count.empty()) return 0;
  const auto short_of_a_group = [&](int64_t n) { return n < fill; };
  size_t taken = 0;
  for (size_t i = 0; i <= place; ++i) {
    const bool any_short = std::any_of(count.begin(), count.end(), short_of_a_group);
    taken = count.size();
    for (size_t c = 0; c < count.size(); ++c)
      if ((!any_short || short_of_a_group(count[c])) && (taken == count.size() || count[c] > count[taken])) taken = c;
    ++count[taken];
  }
  return taken;
}

PeerRecord as_dealt(PeerRecord p) {
  // A peer whose coordinates stay goes to the key they name, whatever a leader that did not know dealt it.
  if (p.dealt_step <= p.step || grid_fixed(p)) return p;
  p.step = p.dealt_step;
  p.group_key = p.dealt_key;
  p.ready = false;
  p.samples = 0;
  p.group_size = std::max<int64_t>(p.group_size, 2);  // only members of a group are dealt
  return p;
}

}  // namespace cohort::p2p

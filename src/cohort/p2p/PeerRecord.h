// A swarm peer's record: what it says of itself to the others (address, step, samples toward the next
// step, readiness, its group key and grid coordinates), sealed by its token and sent by the directory
// (p2p/Directory.h), and the rules that read a record: where a leader's deal sends it (as_dealt) and, on
// a grid whose coordinates stay, its key for any step, its mates, and the cell a peer takes. Its bytes are
// p2p/PeerRecord.cpp's.
//
//   p2p::PeerRecord r{{}, transport.address(), 12, 384, 950.0};
//   r.grid = p2p::grid_word(2, 5);           // coordinates that stay: column 2, row 5
//   p2p::fixed_key_at(r, 13);                // the key it names on step 13 (its column's)
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "cohort/p2p/Transport.h"

namespace cohort::p2p {

struct PeerRecord {
  PeerKey key{};
  std::string address;       // swarm.listen: TCP for frames, UDP for the DHT, the same HOST:PORT
  int64_t step = 0;          // the swarm's global step this peer is on
  int64_t samples = 0;       // samples accumulated toward that step
  double samples_per_s = 0;  // its recent training speed
  bool ready = false;        // it wants to average for `step` now
  bool leaving = false;      // it is leaving (Ctrl-C): leave it out of groups
  double written_unix = 0;   // when the record was written (its expiry counts from here)
  int64_t group_size = 0;    // the size of its last round's group (0: none yet)
  // A digest of its weights after step `digest_step` (-1: none yet): Note [Peers that drifted apart
  // resynchronize] in parallel/swarm/SwarmPeer.cpp. Set by announce_digest, kept by announce.
  int64_t digest_step = -1;
  uint64_t digest = 0;
  // Which process wrote it: a random number per process, and when that process started (Unix seconds).
  // One token in two live processes is told apart from a peer restarted with its own token (Note [One
  // identity, one process] in DirectoryIdentity.cpp). Set by the directory.
  uint64_t session = 0;
  double started_unix = 0;
  // The group it averages in on `step` with swarm.group_size (0: any; Note [Groups on a grid] in
  // p2p/Matchmaking.cpp).
  uint64_t group_key = 0;
  // What its transport reads, as bits (0 from a peer of an earlier release). Set by the directory.
  uint64_t features = 0;
  // Its two grid coordinates, once fixed (swarm.grid=fixed: Note [A grid whose coordinates stay] in
  // parallel/swarm/SwarmGrid.cpp), as grid_word packs them; 0 while they are dealt anew each round.
  uint64_t grid = 0;
  // Where its coordinates stay: the live peers it counts on its column and on its row, itself included, as
  // grid_census packs them; 0 where it does not count them. A leader reads how full the other keys of its
  // dimension are from its mates' (Note [An overfull key splits] in p2p/Matchmaking.cpp).
  uint64_t census = 0;
  static constexpr uint64_t kPairFrames = 1;      // frames for it may carry a MAC (p2p/Auth.h's seal_for)
  static constexpr uint64_t kPolyPairFrames = 2;  // that MAC may be a Poly1305 tag ("CSW3", PairMac::kPoly1305)
  static constexpr uint64_t kPartPieces = 4;      // it reads parts in pieces (Note [A part travels in pieces])
  // It takes its next group key from its leader's count, and reads deals (Note [A leader deals its groups
  // over the next round's keys] in p2p/Matchmaking.cpp).
  static constexpr uint64_t kTakesDeals = 8;
  // It runs swarm.grid=fixed: no peer keeps its coordinates while a live peer does not say this (a peer of
  // an earlier release, or one set to dealt), since that one's leaders would deal it (Note [A grid whose
  // coordinates stay] in parallel/swarm/SwarmGrid.cpp).
  static constexpr uint64_t kFormsGrid = 16;
  // Not in the sealed record: set by the directory from the deal of its last round's leader (Note [A leader
  // deals its groups over the next round's keys] in p2p/Matchmaking.cpp), where that deal is ahead of
  // `step`: the step it goes to and the group key it will name there. -1 and 0 without one.
  int64_t dealt_step = -1;
  uint64_t dealt_key = 0;
  // Not in the sealed record: when this directory last had word that the peer was there, its record's
  // writing or a live leader's deal naming it (Note [A deal vouches for its members]). Its record expires
  // here record_ttl_s after this.
  double heard_unix = 0;
  // Not in the sealed record: when this directory took this record in, by its own clock (Note [Samples
  // trained since the record] in parallel/swarm/SwarmProgress.cpp).
  double taken_unix = 0;
};

// `p` as matchmaking should see it: on its dealt step with its dealt key, not ready and with no samples
// yet, and out of a group of more than one, where a deal is ahead of its record and its coordinates are
// dealt; as it is otherwise.
PeerRecord as_dealt(PeerRecord p);

// PeerRecord::grid: coordinates (c0, c1) that stay, packed with a bit that says so.
uint64_t grid_word(uint64_t c0, uint64_t c1);
// Whether `p` keeps its coordinates (it names its key for every step, and reads no deal of its own).
bool grid_fixed(const PeerRecord& p);
// Its coordinates (c0, c1) as grid_word packed them (zeros where they do not stay).
std::array<uint64_t, 2> grid_coordinates(const PeerRecord& p);
// The group key of `step` for coordinates `cell`: on step s a peer averages along dimension s mod 2, with
// the peers that share its other coordinate (Note [Groups on a grid] in p2p/Matchmaking.cpp). Never 0:
// that is "any group". And the coordinate a group key names.
uint64_t grid_key_at(const std::array<uint64_t, 2>& cell, int64_t step);
uint64_t key_coordinate(uint64_t key);
// The group key a peer whose coordinates stay names on `step` (Note [Groups on a grid] in p2p/Matchmaking.cpp).
uint64_t fixed_key_at(const PeerRecord& p, int64_t step);
// PeerRecord::census: `column` and `row` peers; and the count for coordinate `d` (0: the column) of `p`.
uint64_t grid_census(int64_t column, int64_t row);
int64_t census_of(const PeerRecord& p, size_t d);
// For each coordinate `d` that the records whose coordinates stay among `peers` hold, the most peers any
// of them counts there (PeerRecord::census; coordinates nobody counted are left out).
std::map<uint64_t, int64_t> census_along(const std::vector<PeerRecord>& peers, size_t d);
// Whether two peers whose coordinates stay share one: they average together every other round.
bool grid_mates(const PeerRecord& a, const PeerRecord& b);
// The keys of the grid dimension that keys `step`'s groups, as a peer whose coordinates stay sees them: one
// past the largest such coordinate among `peers` whose coordinates stay and its own, `mine`. A peer holds
// the records of its row and its column, and its row spans the columns. Keys grow as overfull keys split
// (Note [An overfull key splits] in p2p/Matchmaking.cpp).
int64_t grid_keys_along(const std::vector<PeerRecord>& peers, uint64_t mine, int64_t step);
// The cell (c0, c1) of the `rank`-th of the peers that form a grid of `keys` x `keys`: rows and columns
// hold as many peers each, give or take one, and no two share a cell up to keys x keys peers.
std::array<uint64_t, 2> grid_cell(int64_t rank, int64_t keys);
// The coordinate of `keys` that the `place`-th of the peers settling at once takes, when each in turn takes
// the one the most hold of those that hold fewer than `fill` (a group), or, where none does, the one the
// most hold (the lowest on a tie); `held`: the coordinates of the peers whose coordinates stay.
uint64_t settle_coordinate(const std::vector<uint64_t>& held, int64_t keys, size_t place, int64_t fill);
// The same, from each coordinate's count (`count[c]` peers hold c).
uint64_t settle_coordinate(std::vector<int64_t> count, size_t place, int64_t fill);

}  // namespace cohort::p2p

// The directory's side of the DHT (p2p/Directory.h): where a peer's record goes in the DHT, when it is
// put, and which records a read asks for and how often. The loop that calls these is in p2p/Directory.cpp.
#include <opendht/dhtrunner.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <set>
#include <string>
#include <utility>

#include "cohort/p2p/Directory.h"
#include "cohort/p2p/Wire.h"

namespace cohort::p2p {

namespace {

// A peer that knows others puts its record at least this often, whatever dht_put_s (Note [A peer that knows
// others puts seldom]): a third of the minute for which the DHT keeps a value, and for which a heartbeat
// still goes to a peer whose record expired (Directory::kHeartbeatAfterDeathS).
constexpr double kDhtPutKnownMaxS = 20;

using std::chrono::duration;
using std::chrono::steady_clock;

}  // namespace

// Note [The run's records in sixteen buckets]
// Every peer puts its record under the run's DHT key, and each used to read all of them from there every
// dht_read_known_s. OpenDHT fetches a key's values a get, and a packet, a value, from the few nodes
// nearest the key: N records to up to N / dht_read_known_s readers a second, N^2 on those nodes, tens of
// MB/s at 1,000 peers. Nobody had measured it: the transport's counters do not see the DHT's UDP. With
// the kernel's counters (2026-12-06, 64 peers in groups of 8, on loopback) the busiest peer's DHT sent 71
// to 368 kB/s, 451 kB/s of it values while training in one capture, and the others about 1 kB/s.
// So each record names its bucket, one of kDhtBuckets by the first byte of its peer's key (the value's
// user type), and a peer that knows others reads one bucket each dht_read_known_s, in turn, asking for
// that bucket's values alone (a Where on the user type, applied where they are stored): N / 16 records
// a read. An observer reads them all, and so does a peer that asks for fresh records (fresh_peers: waiting for
// the swarm, catching up), once in six reads (Note [A waiting peer reads every record once in six reads]); a
// newcomer reads a bucket at a time too (Note [A newcomer reads a bucket at a time]). The reads of peers that know
// others only merge views the records sent directly did not (a swarm started from two sets of initial peers), now
// within 16 reads, 80 s by default. One key, not a key a bucket: that was tried first, and the 17 searches each peer
// then kept alive cost, in OpenDHT's upkeep, what the values saved (138 to 191 kB/s). Now the busiest peer sends 59 to
// 103 kB/s, its values 19. On loopback one peer carried it all because OpenDHT 2.4.12 replaces a loopback address in
// another node's answer with that node's own (network_engine.cpp) and these peers share a port: every search ran
// through the peer all of them joined through. With the initial peers spread over 8 peers the busiest sent 13 to 17
// kB/s (25 and 27 before). What is left growing: a bucket read's N / 16 records (a get each from each node near the
// key), OpenDHT's upkeep of the searches, and every peer's put every dht_put_s (docs/scaling.md, "An address a peer").
// A record of an earlier release has no bucket: an observer, a waiting peer's read of every record and a newcomer's
// after sixteen empty buckets read it; a peer that knows others otherwise only hears it directly.
void Directory::put(const std::vector<uint8_t>& sealed, std::function<void()> done) {
  auto value = std::make_shared<dht::Value>(sealed.data(), sealed.size());
  value->id = detail::dht_value_id(me_.token.peer_public_key);
  value->type = detail::kDhtRecordType;
  value->user_type = detail::dht_bucket_name(detail::dht_bucket(me_.token.peer_public_key));
  dht_->put(dht::InfoHash::get(key_), value, [done = std::move(done)](bool) {
    if (done) done();
  });
}

// Note [A peer that knows others puts seldom]
// Every peer put its record every dht_put_s (2 s), and OpenDHT follows each put with a find to each of the
// nodes near the run's key, each answered with a list of nodes, and an answer to the put: in 64 network
// namespaces, while training, the puts and what follows them were 306 of the DHT's 475 kB/s, 4 finds a
// peer a second (bench/scale.py --netns, 2026-12-07, with Note [A read of many records delays the next]),
// and every put reaches the same few nodes, N / 2 a second there. But nothing needs the DHT's copy to be
// live. A peer that knows nobody knocks on the address of every record it read, live or not (Note [A peer
// that knows nobody knocks]); a peer that knows others sends its heartbeat to a peer whose record expired
// up to kHeartbeatAfterDeathS ago, and that peer answers with its record (Note [A heartbeat to nobody is
// answered]); the records sent directly keep the known peers live. So once a peer knows others it puts its
// record every kDhtPutKnownPuts dht_put_s (20 s by default), but at least every kDhtPutKnownMaxS: the DHT
// keeps a value a minute, and a heartbeat goes to an expired record for a minute (with swarm.announce_s 4,
// puts 80 s apart would leave a record out of the DHT for part of each gap). It puts at once when it
// leaves; a peer that knows nobody puts every dht_put_s as before, so that the first peers of a swarm find
// each other's records live. The DHT's copy of a record is then up to 20 s old: what it says of the step,
// samples and readiness lags that much, and a waiting peer counts as seen (peers_seen) the peers whose
// copies it read before it has met them.
// An observer that reads the DHT alone (cohort swarm status) counts a record live for record_ttl_s and that
// much more (survey in parallel/swarm/SwarmPeer.cpp): a peer that died shows there for up to 24 s.
double Directory::known_put_gap(const DirectoryOptions& options) {
  return std::max(options.dht_put_s, std::min(kDhtPutKnownPuts * options.dht_put_s, kDhtPutKnownMaxS));
}

// Note [A waiting peer reads every record once in six reads]
// A peer waiting for swarm.min_peers_to_start (and one catching up) asks fresh_peers for every record, and
// with that every read it made was of every record: one each dht_read_known_s from each waiting peer, and
// OpenDHT 2.4.12 fetches each record of a read with a get of its own from each of the nodes near the run's
// key. In 64 network namespaces (bench/scale.py --netns, 2026-12-07) those reads sent up to 7.8 MB/s in all
// while the peers waited for each other, 120 kB/s a peer: N records to N readers. A peer's DHT sent 1.6 to
// 1.9 MB before its first step, the busiest 8.9 to 10.2 (0.5 to 0.6 and 2.5 to 3.1 since). Between two
// reads of every record a waiting peer hears the peers it found directly, and the peers that found it beat
// to it (Note [Records go to the peers directly]), and the records they pass on. So a read of every record
// that fresh_peers asks for is made at most once in kFullReadGapReads reads' time (30 s by default) after
// the last that completed, or after the directory started (Note [A newcomer reads a bucket at a time]), the
// reads in between of the next bucket. A read of every record that failed does not count: the next is made
// at once.

// Note [A newcomer reads a bucket at a time]
// A peer that knows nobody read every record of the run each dht_read_s until it met someone, and then,
// waiting for the swarm, every record again at once (fresh_peers): 83 reads of every record by 64 peers
// in network namespaces in a captured run (bench/scale.py --netns, 2026-12-07), 0.24 to 0.31 MB of DHT a
// peer before its first step, N records to N peers through the few nodes near the run's key (8 reads and
// 0.12 to 0.13 MB since: bench/results/dht_newcomer_buckets.json). A newcomer needs one live peer, not all of them: the
// peers it meets tell the others of it and it of them (their heartbeats, and the records they pass on: Note [The
// heartbeat passes on a few records] in p2p/DirectorySend.cpp), and it knocks on the address of every record it read
// (Note [A peer that knows nobody knocks]). So a peer that knows nobody reads the buckets in turn, from a random one:
// at 64 peers a read brings about four records. A read that brought no other peer's record is followed by the next
// dht_read_s / kSweepReadsPerRead after it started (at the loop's next 50 ms), so a near-empty swarm's sixteen
// buckets are swept in about 2.5 s where a get is answered within 100 ms (more over a slow network), where a
// read of every record came each second; a read that failed does not count. Once kDhtBuckets reads in a row
// brought nobody, the next is of every record (it also finds an earlier release's records, which have no
// bucket), and reads go on at one each dht_read_s, every kDhtBuckets-th of every record. And the directory's start
// counts as a read of every record: a peer waiting for the swarm makes its first kFullReadGapReads reads' time (30 s)
// after it started, not at once (Note [A waiting peer reads every record once in six reads]), and only while a caller
// of fresh_peers waits: a wish left by a caller that had stopped waiting made a read of every record after the swarm
// had started (25 of them, by 23 of 64 peers, 28 to 49 s into a captured run). An observer (cohort swarm status, with
// no transport) reads every record each dht_read_s, as before: it has no other way in.
//
// Reads the run's records from the DHT without waiting: the answers arrive on OpenDHT's thread.
bool Directory::start_read(bool publishing, bool knows_peers) {
  std::string bucket;  // empty: every record
  bool everything = !publishing;
  {
    std::lock_guard lock(mutex_);
    if (read_in_flight_) return false;
    read_in_flight_ = true;
    ++reads_started_;
    // A sweep of every bucket found nobody (Note [A newcomer reads a bucket at a time]).
    if (!knows_peers && empty_reads_ > 0 && empty_reads_ % kDhtBuckets == 0) everything = true;
    // fresh_peers asked for every record (Note [A waiting peer reads every record once in six reads]).
    const auto full_gap = duration<double>(kFullReadGapReads * options_.dht_read_known_s);
    const bool full_due = steady_clock::now() - last_full_read_ >= full_gap;
    if (full_read_waiters_ > 0 && full_due) everything = true;
    if (!everything) bucket = detail::dht_bucket_name(next_bucket_), next_bucket_ = (next_bucket_ + 1) % kDhtBuckets;
  }
  // The other peers' records it brought, by value id (one a peer): nodes that hold a record at different
  // versions answer with each (Note [A read of many records delays the next]). OpenDHT calls back on one
  // thread.
  auto ids = std::make_shared<std::set<uint64_t>>();
  const uint64_t mine = detail::dht_value_id(me_.token.peer_public_key);
  dht_->get(
      dht::InfoHash::get(key_),
      [this, ids, mine](const std::vector<std::shared_ptr<dht::Value>>& values) {
        for (const auto& value : values) {
          if (!value) continue;
          if (value->id != mine) ids->insert(value->id);
          take_in(value->data.data(), value->data.size(), PublicKey{});
        }
        return true;
      },
      [this, everything, ids, alone = !knows_peers](bool ok) {
        std::lock_guard lock(mutex_);
        read_in_flight_ = false;
        if (ok && everything) last_full_read_ = steady_clock::now();  // one that failed is tried again at once
        last_read_records_ = ids->size();
        // A read that failed leaves the count as it was: after a failed read of every record, the next is one.
        if (!alone)
          empty_reads_ = 0;
        else if (ok)
          empty_reads_ = ids->empty() ? empty_reads_ + 1 : 0;
        ++reads_;
        changed_.notify_all();
      },
      {}, bucket.empty() ? dht::Where{} : dht::Where{}.userType(bucket));
  return true;
}

// Note [A read of many records delays the next]
// A peer that knows others read one bucket every dht_read_known_s, N / 16 records a read, and OpenDHT
// 2.4.12 fetches each with a get of its own from each of the nodes near the run's key: a peer's DHT sent
// 2.0, 4.3, 8.5 and 15.6 kB/s at 8, 16, 32 and 64 peers in network namespaces (bench/scale.py --netns,
// 2026-12-07), and a read of every record that fresh_peers asks for brought all N at once. So a read that
// brought k records (distinct peers: two nodes may answer with two versions of one) delays the next by
// k / kDhtRecordsPerRead reads' time, one dht_read_known_s at the least and kFullReadGapReads at the most:
// a peer that knows others fetches about two records each dht_read_known_s up to 192 peers (16 buckets of
// 12), and a read of every record that fresh_peers asks for still comes once in six reads' time (Note [A
// waiting peer reads every record once in six reads]). 2.2, 3.5, 5.9 and 9.5 kB/s since (bench/results/
// dht_read_pacing.json); what is left is the puts (Note [A peer that knows others puts seldom]), OpenDHT's
// upkeep of its searches, and the reads of peers that know nobody. What it slows is what these reads are
// for, merging views that the records sent directly did not. One peer reads a given bucket less often, but
// the swarm as a whole still reads about 32 buckets each dht_read_known_s past 32 peers (N peers, each a
// bucket every N / 32 reads), each bucket twice: a peer whose view split from the others' is read by one of
// them within a read or two, and the heartbeat's gossip brings each peer about 16 records a second besides
// (Note [The heartbeat passes on a few records] in p2p/DirectorySend.cpp). A peer that knows nobody reads
// a bucket at a time, faster while its reads find nobody (Note [A newcomer reads a bucket at a time]).
double Directory::read_gap(bool publishing, bool knows_peers) const {
  std::lock_guard lock(mutex_);
  if (!knows_peers) {  // Note [A newcomer reads a bucket at a time]
    const bool sweeping = publishing && last_read_records_ == 0 && empty_reads_ < kDhtBuckets;
    return sweeping ? options_.dht_read_s / kSweepReadsPerRead : options_.dht_read_s;
  }
  const double reads = std::clamp(static_cast<double>(last_read_records_) / kDhtRecordsPerRead, 1.0, kFullReadGapReads);
  return options_.dht_read_known_s * reads;
}

namespace detail {

std::string dht_run_key(const PeerKey& run_public_key) {
  return "cohort-swarm/" + hex(run_public_key.data(), run_public_key.size());
}

int dht_bucket(const PeerKey& peer) { return peer[0] % Directory::kDhtBuckets; }

// The first 8 bytes of its key: the nodes that store it replace a value by id.
uint64_t dht_value_id(const PeerKey& peer) {
  uint64_t id = 0;
  for (size_t i = 0; i < 8; ++i) id = (id << 8) | peer[i];
  return id;
}

std::string dht_bucket_name(int bucket) { return "b" + std::to_string(bucket % Directory::kDhtBuckets); }

}  // namespace detail

}  // namespace cohort::p2p

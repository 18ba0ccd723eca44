// Who is in the swarm: each peer's record (address, global step, samples accumulated toward the next
// step, samples/s). Peers find each other in OpenDHT, the Kademlia DHT that Hivemind's peers use too, and
// then send their records straight to the peers they know (Note [Records go to the peers directly]).
// There is no master: a peer bootstraps from any live peer in swarm.initial_peers, and the records of the
// run live in the DHT (under a key made from the run's public key), so the first peer may leave and the
// rest go on.
//
//   p2p::Directory directory(identity, run_key, "10.0.0.2:7000", {"10.0.0.3:7000"}, options, log, &transport);
//   directory.announce({.address = transport.address(), .step = 12, .samples = 384});
//   for (const auto& peer : directory.peers()) ...   // live peers other than this one, newest record each
//
// Every record is sealed with its peer's token (p2p/Auth.h): a record from a peer without a valid,
// unexpired token of this run is refused and named in the log. A record expires `record_ttl_s` after it
// was written; a peer resends its own at least every `announce_s` + record_ttl_s / 2 (every `announce_s`
// unless a change went out lately), so a dead peer drops out within the TTL.
//
// Note [Records go to the peers directly]
// Progress records change at every local step. Read back from the DHT, a record lagged its peer by up to a
// second (a put, then the others' next read): a leader closed groups without peers it did not yet see as
// ready, which then stepped alone and drifted (Note [A peer that fell out of a round resynchronizes]), and
// a swarm's steps waited on the lag. So the DHT is for finding peers (a record put every `dht_put_s`, seldom
// once its peer knows others, read every `dht_read_s`), and each change of a record goes to the known peers as one
// frame over the swarm's transport (at once when the step, readiness or leaving changes; other changes at most every 50
// ms; with group keys, readiness and a peer's samples only to the peers of its key: Notes [Readiness goes to the group]
// in DirectorySend.cpp and [The target batch counted in the key and scaled to the swarm] in
// parallel/swarm/SwarmProgress.cpp). The heartbeat, every announce_s, goes to every known peer that did not
// hear this one's record lately (Note [A heartbeat skips the peers that heard this one lately]), or, while
// a leader's deal vouches for this one, only to those that do not read deals (Note [A deal vouches for its
// members]); to a few of them (the peers met in the last beats, and two drawn at random) it also carries up to 8 live
// records of the other peers this one knows, drawn anew each beat (each still sealed by its own peer), so that two
// peers who found each other in the DHT learn everyone the other knows within a few beats, whatever their own view of
// the DHT (Notes [The heartbeat is its own clock] in Directory.cpp and [The heartbeat passes on a few records] in
// DirectorySend.cpp). A peer that knows others reads the DHT only every dht_read_known_s, and less often after a
// read of many records (the reads are most of what the DHT costs: Note [A read of many records delays the next] in
// DirectoryDht.cpp); a newcomer finds the live peers there, and by knocking on its initial peers (Note [A peer that
// knows nobody knocks]), and tells them of itself directly.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cohort/p2p/Auth.h"
#include "cohort/p2p/PeerRecord.h"
#include "cohort/p2p/Transport.h"

namespace dht {
class DhtRunner;
}

namespace cohort::p2p {

// One member of a round's groups and the group key the leader dealt it for the next step.
struct Dealt {
  PeerKey key{};
  uint64_t next_key = 0;
};

// A peer of another run that refused this one (Note [A peer of another run is told so]).
struct Refusal {
  PeerKey peer{};
  std::string address;
  PeerKey run_key{};  // the run key its token names: the run it belongs to
};

struct DirectoryOptions {
  double announce_s = 1.0;  // a peer's heartbeat: its record to each peer it knows that no change reached lately
  double dht_put_s = 2.0;   // and puts it into the DHT this often (and when it leaves)
  // and reads a bucket of the run's records from the DHT this often while it knows no peer (more often while the
  // buckets it reads are empty: Note [A newcomer reads a bucket at a time]); an observer reads every record this often
  double dht_read_s = 1.0;
  double dht_read_known_s = 5.0;  // and this often once it does (newcomers announce themselves directly)
  double record_ttl_s = 4.0;      // a record older than this is a dead peer's
  bool forms_grid = false;        // its records say it would keep its coordinates (PeerRecord::kFormsGrid)
};

class Directory {
 public:
  // Non-urgent changes of this peer's record (its samples) go out at most this often: a reader's view of
  // them lags by up to this much (parallel/swarm/SwarmProgress.cpp's samples_toward makes up for it).
  static constexpr double kMinDirectGapS = 0.05;

  // `transport` carries the records between known peers and must outlive the directory; without one
  // (cohort swarm status, an observer) only the DHT is read and nothing is published.
  Directory(PeerIdentity me, PeerKey run_public_key, const std::string& listen,
            const std::vector<std::string>& initial_peers, DirectoryOptions options,
            std::function<void(const std::string&)> log, Transport* transport = nullptr);
  ~Directory();
  Directory(const Directory&) = delete;
  Directory& operator=(const Directory&) = delete;

  // Who must hear a change of this peer's record before the next heartbeat.
  enum class Reach {
    kEveryone,
    // Only the peers on its step with its group key (PeerRecord::group_key; everyone where that is 0):
    // readiness, which only its group's matchmaking reads (Note [Readiness goes to the group]).
    kGroup,
    // As kGroup, for a change of step and key that the last round's leader already told the others of
    // (Note [A leader deals its groups over the next round's keys] in p2p/Matchmaking.cpp).
    kDealt,
    // A change of step of a peer whose coordinates stay: to the peers that share one with it, which meet
    // it in their next two rounds (Note [A grid whose coordinates stay] in parallel/swarm/SwarmGrid.cpp).
    kGrid,
  };
  // This peer's record: sent to the known peers now (a change of step, readiness or leaving) or within
  // 50 ms (other changes), and again with the heartbeat every announce_s to the peers no change reached
  // lately (Notes [Records go to the peers directly], [A heartbeat skips the peers that heard this one
  // lately]).
  void announce(PeerRecord mine, Reach reach = Reach::kEveryone);
  // Where a leader (this peer, or the sender of a kDeal frame) dealt its groups' members for `step`: their
  // records then show it (PeerRecord::dealt_step) until they get there (Note [A leader deals its groups
  // over the next round's keys] in p2p/Matchmaking.cpp).
  // `from`: the leader that sent it (zero: this peer's own).
  void take_deal(int64_t step, const std::vector<Dealt>& dealt, const PeerKey& from = PeerKey{});
  // This peer led round `round`: takes its deal, sends it to `to` (one kDeal frame each), and re-sends it
  // to the live peers, naming each member still heard from until that member's next round (Note [A leader
  // vouches for its members until its next round] in p2p/DirectorySend.cpp).
  void deal(uint64_t round, const std::vector<Dealt>& dealt, const std::vector<PeerRecord>& to);
  // Adds to this peer's record the digest of its weights after `step` (sent with its next record).
  void announce_digest(int64_t step, uint64_t digest);
  // The live peers other than this one, as of the last read; newest record of each.
  std::vector<PeerRecord> peers() const;
  // Waits until a read of the DHT that starts after this call completes (or `timeout_s`), a read of every
  // record unless this peer completed one, or started, within the last kFullReadGapReads reads' time (then
  // of the next bucket: Notes [A waiting peer reads every record once in six reads], [A newcomer reads a
  // bucket at a time] in p2p/DirectoryDht.cpp); returns the live peers then.
  std::vector<PeerRecord> fresh_peers(double timeout_s);
  // Says that this peer leaves (`mine`, with `leaving` set: the others leave it out of their groups), and
  // waits until that record was handed to the transport for the known peers and a put of it into the DHT
  // was answered or failed (at once without a DHT contact), or `timeout_s`.
  void leave(PeerRecord mine, double timeout_s);
  // Distinct peers ever seen alive (for the run's summary).
  int64_t peers_seen() const;
  // Empty, or what shows that another live process, started before this one, holds this peer's
  // identity (the same swarm.token): this one must stop (Note [One identity, one process]).
  std::string identity_taken() const;
  // The peers of another run that refused this one so far.
  std::vector<Refusal> refusals() const;
  // Bytes this peer's DHT node sent (UDP), since it started: its puts and reads, and its answers to the
  // others' (the transport's counters see only the frames).
  int64_t dht_bytes_sent() const;

  // The run's records fall in this many buckets, by the first byte of each peer's key, and a peer reads one at
  // a time (Notes [The run's records in sixteen buckets], [A newcomer reads a bucket at a time] in
  // p2p/DirectoryDht.cpp).
  static constexpr int kDhtBuckets = 16;
  // A read of every record that fresh_peers asks for is made at most once in this many dht_read_known_s
  // (Note [A waiting peer reads every record once in six reads] in p2p/DirectoryDht.cpp).
  static constexpr double kFullReadGapReads = 6;
  // A peer that knows others fetches about this many records a dht_read_known_s from the DHT: a read that
  // brought k records delays the next by k / kDhtRecordsPerRead reads' time, at most kFullReadGapReads
  // (Note [A read of many records delays the next] in p2p/DirectoryDht.cpp).
  static constexpr double kDhtRecordsPerRead = 2;
  // A peer that knows nobody reads the next bucket up to this many times a dht_read_s while its reads bring
  // no other peer's record, for kDhtBuckets reads in a row (Note [A newcomer reads a bucket at a time]).
  static constexpr double kSweepReadsPerRead = 8;
  // Once it knows others, a peer puts its record into the DHT every this many dht_put_s, and when it
  // leaves: the DHT's copy is an address to knock on more than a live record (Note [A peer that knows
  // others puts seldom] in p2p/DirectoryDht.cpp). An observer that reads the DHT alone counts a record live
  // for this many dht_put_s past record_ttl_s.
  static constexpr double kDhtPutKnownPuts = 10;
  // How often a peer that knows others puts its record: kDhtPutKnownPuts dht_put_s, at most 20 s, and never
  // less often than dht_put_s (Note [A peer that knows others puts seldom] in p2p/DirectoryDht.cpp).
  static double known_put_gap(const DirectoryOptions& options);
  // DHT reads completed since it started (the tests read it).
  uint64_t dht_reads() const;

 private:
  void run();
  bool has_contact() const;  // Note [No DHT request before the first contact]
  // Sends `mine` (sealed; `version`: everyone_version_ when it was) to every live peer, or, given
  // `group_of` (the record sealed in `mine`), only to the live peers on its step with its group key. The
  // heartbeat (`with_others`) passes on others' records to a few and skips the peers heard_lately.
  // `skip_heard`: a heartbeat that carries no change not yet sent.
  // `grid_of` (the record sealed in `mine`, where its coordinates stay): only to the peers that share a
  // coordinate with it, the peers whose coordinates are still dealt, and the heartbeat's gossip peers
  // (Note [A grid whose coordinates stay] in parallel/swarm/SwarmGrid.cpp).
  void send_direct(const std::vector<uint8_t>& mine, uint64_t version, bool with_others, bool skip_heard,
                   const PeerRecord* group_of, const PeerRecord* grid_of);
  // Whether `peer` was sent this peer's record at `version` recently enough to skip a heartbeat (Note [A
  // heartbeat skips the peers that heard this one lately]).
  bool heard_lately(const PeerKey& peer, uint64_t version, std::chrono::steady_clock::time_point now) const;
  // How long a record sent, or a deal naming this peer, lets its heartbeat skip a peer: record_ttl_s / 2 -
  // announce_s (Notes [A heartbeat skips the peers that heard this one lately], [A deal vouches for its
  // members]); a leader re-sends its deal every three quarters of it.
  std::chrono::duration<double> skip_window() const;
  // Whether a deal named this peer recently enough for its heartbeat to skip the live peers that read
  // deals (Note [A deal vouches for its members]).
  // `dealer`: the leader whose deal it was, zero for this peer's own.
  bool vouched_lately(std::chrono::steady_clock::time_point now, PeerKey& dealer) const;
  // Re-sends this peer's standing deal when due (Note [A leader vouches for its members until its next
  // round]).
  void resend_deal();
  // One kDeal frame for round `round` naming `dealt` to each of `to`.
  void send_deal(uint64_t round, const std::vector<Dealt>& dealt, const std::vector<PeerRecord>& to);
  // A record frame from `to` came addressed to whoever listens here: `to` does not hold this peer's record
  // live, so it is sent this peer's record (Note [A heartbeat to nobody is answered]).
  void owe_record(const PeerKey& to);
  // Leaves in `owed` the peers not answered within kMinAnswerGapS, and sends them `mine`.
  void take_due_answers(std::set<PeerKey>& owed);
  void answer(const std::vector<uint8_t>& mine, const std::set<PeerKey>& owed);
  // Up to kGossipRecords of the other live records, drawn at random, and the peers of `to` the heartbeat
  // passes them on to, into `gossip_to` (Note [The heartbeat passes on a few records]).
  // `grid_of`: this peer's record, where its coordinates stay: the peers that share none are not welcomed,
  // and every live record is returned, shuffled, for send_direct to pass each peer its own mates' (Note [A
  // grid whose coordinates stay] in parallel/swarm/SwarmGrid.cpp).
  struct Passed {
    PeerRecord record;
    std::vector<uint8_t> sealed;
  };
  std::vector<Passed> gossip(const std::vector<PeerRecord>& to, std::set<PeerKey>& gossip_to,
                             const PeerRecord* grid_of = nullptr);
  // The live peers and those whose record expired less than kHeartbeatAfterDeathS ago (Note [A peer whose
  // record expired still hears the heartbeat]).
  std::vector<PeerRecord> heartbeat_peers() const;
  // Whether peers() would not be empty, without copying the records.
  bool any_live_peer() const;
  // The other peers' records written since `oldest_unix`, of peers that did not say they were leaving.
  std::vector<PeerRecord> written_since(double oldest_unix) const;
  // Sends `mine` to swarm.initial_peers and the peers seen (Note [A peer that knows nobody knocks]).
  void knock(const std::vector<uint8_t>& mine);
  // `done`, if any, is called on OpenDHT's thread once the put completed or failed.
  void put(const std::vector<uint8_t>& sealed, std::function<void()> done = {});
  // announce, and for leave() the number of this leave in `leave_no`: its record is sent urgently.
  void announce(PeerRecord mine, Reach reach, uint64_t* leave_no);
  // Reads the run's records: every one, or the next bucket's in turn (Note [A newcomer reads a bucket at a
  // time]). `publishing`: this peer has a record (not an observer); `knows_peers`: it knows live peers.
  // False when a read was still in flight: none started.
  bool start_read(bool publishing, bool knows_peers);
  // How long after the last read's start the next is due (Notes [A read of many records delays the next],
  // [A newcomer reads a bucket at a time]).
  double read_gap(bool publishing, bool knows_peers) const;
  // Takes in one sealed record, from the DHT (no carrier: all zero) or in a frame of `carrier`: kept when
  // newer than the last of that peer. The carrier's own record is vouched for by its frame (open_carried).
  void take_in(const uint8_t* data, size_t size, const PeerKey& carrier);
  // A record or a refusal from a peer of another run (Note [A peer of another run is told so]).
  void take_in_foreign(const Message& m, const PeerKey& run_key);
  // A leader's deal (a kDeal frame from a live peer): where its groups' members of `round` go next.
  void take_in_deal(const Message& m);

  static constexpr double kMinAnswerGapS = 0.5;        // a peer is answered at most this often
  static constexpr size_t kGossipRecords = 8;          // others' records a heartbeat passes on, at most
  static constexpr size_t kGossipFanout = 2;           // peers, drawn at random, a heartbeat passes them to
  static constexpr double kWelcomeBeats = 3;           // and peers met within this many announce_s
  static constexpr double kHeartbeatAfterDeathS = 60;  // heartbeats still go to a peer this long after its TTL

  PeerIdentity me_;
  PeerKey run_public_key_;
  DirectoryOptions options_;
  std::function<void(const std::string&)> log_;
  Transport* transport_;
  std::unique_ptr<dht::DhtRunner> dht_;
  std::string key_;  // the DHT key of this run's records
  std::shared_ptr<std::atomic<int64_t>> dht_sent_ = std::make_shared<std::atomic<int64_t>>(0);
  std::vector<std::string> initial_peers_;
  std::string mine_address_;                // swarm.listen
  static constexpr size_t kMaxKnocks = 64;  // addresses knocked on at most, each announce_s

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  PeerRecord mine_;
  bool mine_dirty_ = false;        // changed since it was last sent
  bool mine_urgent_ = false;       // its step, readiness or leaving changed: send it now
  bool mine_to_everyone_ = false;  // a change since it was last sent to everyone is not Reach::kGroup's
  bool mine_to_grid_ = false;      // a change since it was last sent is Reach::kGrid's
  uint64_t everyone_version_ = 0;  // counts the changes of this peer's record meant for everyone
  // What send_direct last sent each peer, other than a heartbeat: when and at which everyone_version_.
  // The directory's thread alone reads and writes it.
  struct Sent {
    std::chrono::steady_clock::time_point at;
    uint64_t version = 0;
  };
  std::map<PeerKey, Sent> sent_;
  bool read_in_flight_ = false;
  int next_bucket_ = 0;        // the bucket this peer reads next
  int full_read_waiters_ = 0;  // callers of fresh_peers waiting: a read that starts now reads every record, when due
  // A read of every record last completed, or this directory started (Note [A newcomer reads a bucket at a
  // time]).
  std::chrono::steady_clock::time_point last_full_read_ = std::chrono::steady_clock::now();
  int empty_reads_ = 0;  // reads in a row that brought no other peer's record, while it knew nobody
  // leave() calls so far, and the last of them whose record went out (its put answered, or no DHT contact).
  uint64_t leaves_asked_ = 0, leaves_done_ = 0;
  // Addresses of peers met, to make DHT contacts of (Note [Every peer is a DHT contact]).
  std::vector<std::string> to_contact_;
  struct Entry {
    uint64_t counter = 0;  // its seal's counter: a record replaces only an older one
    PeerRecord record;
    std::vector<uint8_t> sealed;  // as its peer sealed it, to pass on
    double met_unix = 0;          // when its record last became live here (first seen, or back after its TTL)
    double vouched_unix = 0;      // when a live leader's deal last named it (Note [A deal vouches for its members])
    double taken_unix = 0;        // when this record was taken in here (PeerRecord::taken_unix)
    double heard_unix() const { return std::max(record.written_unix, vouched_unix); }
  };
  std::map<PeerKey, Entry> records_;  // the newest record of each peer
  // The newest deal of each peer: the step and key a leader dealt it (key 0: two leaders dealt it
  // different keys for that step, so nobody knows). Dropped once its record reaches the step.
  struct Deal {
    int64_t step = -1;
    uint64_t key = 0;
  };
  std::map<PeerKey, Deal> dealt_;
  std::chrono::steady_clock::time_point deals_pruned_{};
  // When a deal last named this peer (its leader's, heard by the peers that leader knows): its heartbeat
  // may then skip them (Note [A deal vouches for its members]).
  std::chrono::steady_clock::time_point vouched_{};
  PeerKey dealer_{};  // the leader of that deal: this peer's heartbeat always goes to it
  // The last deal this peer made as a leader, re-sent while it names anyone (Note [A leader vouches for
  // its members until its next round]); empty once it names nobody.
  struct Standing {
    uint64_t round = 0;
    std::vector<Dealt> dealt;
    std::chrono::steady_clock::time_point sent{};
  };
  Standing standing_;
  std::set<PeerKey> owed_;  // peers to answer (Note [A heartbeat to nobody is answered])
  // When each peer was last answered. The directory's thread alone reads and writes it.
  std::map<PeerKey, std::chrono::steady_clock::time_point> answered_;

  // The parts of take_in for a record of this peer's own key, and for a record whose key another live
  // process holds too (Note [One identity, one process]). Called under mutex_; what to send goes to
  // `replies` (address, kRecord body), sent after it is released.
  using Replies = std::vector<std::pair<std::string, std::vector<uint8_t>>>;
  void take_in_own_key(const PeerRecord& rec, Replies& replies);
  void introduce_twins(const Entry& held, const PeerRecord& rec, const uint8_t* data, size_t size, Replies& replies);

  const uint64_t session_;  // this process's (Note [One identity, one process])
  const double started_unix_;
  std::vector<uint8_t> mine_sealed_;  // this peer's record as last sent
  std::string identity_taken_;
  std::map<uint64_t, double> twins_answered_;                   // by session: when last answered
  std::map<std::pair<uint64_t, uint64_t>, double> introduced_;  // twin sessions: when introduced
  std::minstd_rand gossip_random_{std::random_device{}()};      // which records a heartbeat passes on
  std::map<PeerKey, Refusal> refused_by_;                       // peers of another run that refused this one
  std::map<PeerKey, double> refusal_sent_;                      // peers of another run told: when
  std::set<PeerKey> seen_;
  std::set<std::string> refused_logged_;    // each refusal logged once, not at every read
  uint64_t reads_started_ = 0, reads_ = 0;  // DHT reads started and completed
  size_t last_read_records_ = 0;            // distinct records of other peers the last read that completed brought
  bool stopping_ = false;
  std::thread thread_;
};

namespace detail {
// The record's formats (p2p/PeerRecord.cpp), for the directory's files and the tests; not for users.
double unix_now();  // a record's times are Unix seconds
std::vector<uint8_t> encode_record(const PeerRecord& r);
// The record in `payload`, if it is well formed and speaks for `signer`, the peer that sealed it.
std::optional<PeerRecord> decode_record(const std::vector<uint8_t>& payload, const PeerKey& signer);
// One sealed record, as a kRecord body holds it: its bytes and their number.
using SealedRecord = std::pair<const uint8_t*, size_t>;
// A kRecord frame's body: the number of records, then each sealed record with its length.
std::vector<uint8_t> records_body(const std::vector<SealedRecord>& records);
// The sealed records of a kRecord body, up to the first that is cut short (pointing into `body`).
std::vector<SealedRecord> sealed_records(const std::vector<uint8_t>& body);
// The DHT key the records of the run with public key `run_public_key` go under, and the DHT value type
// they are put as (Note [A peer's record is edited in place] in p2p/Directory.cpp).
std::string dht_run_key(const PeerKey& run_public_key);
constexpr uint16_t kDhtRecordType = 0x4348;
// The bucket of the run's records a peer's goes to (Note [The run's records in sixteen buckets] in
// p2p/DirectoryDht.cpp), and its name, the DHT value's user type that a read of one bucket asks for.
int dht_bucket(const PeerKey& peer);
// The DHT value id of a peer's record: one a peer, so that its newer record replaces its older one.
uint64_t dht_value_id(const PeerKey& peer);
std::string dht_bucket_name(int bucket);
// A kDeal body: the members a leader dealt for the step after its round, and the keys it dealt them.
std::vector<uint8_t> deal_body(const std::vector<Dealt>& dealt);
// Its members, or nothing when the body is malformed.
std::vector<Dealt> dealt_from(const std::vector<uint8_t>& body);
}  // namespace detail

}  // namespace cohort::p2p

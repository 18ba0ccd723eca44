// Who is in the swarm (p2p/Directory.h): this peer's record, the views of the others, and the loop that sends
// it (whom to: p2p/DirectorySend.cpp) and puts and reads the DHT (what and when: p2p/DirectoryDht.cpp).
#include "cohort/p2p/Directory.h"

#include <opendht/dhtrunner.h>
#include <algorithm>
#include <chrono>
#include <ctime>
#include <random>
#include <set>
#include <utility>

#include "cohort/p2p/Wire.h"
#include "cohort/util/Error.h"

namespace cohort::p2p {

namespace {

// The DHT value type of a peer record (Note [A peer's record is edited in place]).
//
// Note [A peer's record is edited in place]
// OpenDHT's default type refuses to replace a stored value with a new one of the same id (its edit policy is "never"),
// and keeps every value for 10 minutes, so a peer's updates would never reach the nodes that store its first record.
// Every cohort node registers this type: a record may be replaced (a forged replacement is still refused by whoever
// reads it: records are sealed) and expires soon after its peer stops republishing it.
constexpr dht::ValueType::Id kRecordType = detail::kDhtRecordType;

using std::chrono::duration;
using std::chrono::steady_clock;

// OpenDHT's UDP socket, counting the bytes it sends (Directory::dht_bytes_sent): the DHT's share of a
// peer's background traffic, which the transport's counters do not see (Note [The run's records in
// sixteen buckets]).
class CountingSocket : public dht::net::UdpSocket {
 public:
  CountingSocket(const dht::SockAddr& bind4, const dht::SockAddr& bind6, std::shared_ptr<std::atomic<int64_t>> sent)
      : UdpSocket(bind4, bind6), sent_(std::move(sent)) {}
  int sendTo(const dht::SockAddr& dest, const uint8_t* data, size_t size, bool replied) override {
    const int error = UdpSocket::sendTo(dest, data, size, replied);
    if (error == 0) *sent_ += static_cast<int64_t>(size);
    return error;
  }

 private:
  std::shared_ptr<std::atomic<int64_t>> sent_;
};

uint64_t new_session() {
  std::random_device device;
  uint64_t session = 0;
  while (session == 0) session = (uint64_t{device()} << 32) | device();  // 0 is "a writer without sessions"
  return session;
}

}  // namespace

Directory::Directory(PeerIdentity me, PeerKey run_public_key, const std::string& listen,
                     const std::vector<std::string>& initial_peers, DirectoryOptions options,
                     std::function<void(const std::string&)> log, Transport* transport)
    : me_(std::move(me)),
      run_public_key_(run_public_key),
      options_(options),
      log_(std::move(log)),
      transport_(transport),
      dht_(std::make_unique<dht::DhtRunner>()),
      key_(detail::dht_run_key(run_public_key)),
      session_(new_session()),
      started_unix_(detail::unix_now()) {
  next_bucket_ = static_cast<int>(std::random_device{}() % kDhtBuckets);  // peers do not read in step
  const auto [host, port] = split_host_port(listen, "swarm.listen");
  dht::DhtRunner::Config config;
  config.threaded = true;
  config.dht_config.node_config.is_bootstrap = false;
  const auto addresses = dht::SockAddr::resolve(host, std::to_string(port));
  if (addresses.empty())
    throw ConfigError("swarm.listen=" + listen + ": cannot resolve " + host, "give an address of this machine");
  config.bind4 = addresses.front();
  try {
    dht::DhtRunner::Context context;
    context.sock = std::make_unique<CountingSocket>(config.bind4, config.bind6, dht_sent_);
    dht_->run(config, std::move(context));
    // Note [A DHT value outlives OpenDHT's reannounce margin]
    // OpenDHT puts a value again REANNOUNCE_MARGIN
    // (10 s) before it expires. A type that expires within 10 s is put again at once, without end: the
    // records' first type (10 s) made every node send about 900 puts a second (measured, 1 MB/s a peer).
    // The stored copy lives a minute; readers judge liveness by the record's own time (record_ttl_s).
    const auto keep = std::chrono::seconds(static_cast<int64_t>(std::max(60.0, 4 * options_.record_ttl_s)));
    dht_->registerType(
        dht::ValueType(kRecordType, "cohort-swarm-peer", keep, dht::ValueType::DEFAULT_STORE_POLICY,
                       [](dht::InfoHash, const std::shared_ptr<dht::Value>&, std::shared_ptr<dht::Value>&,
                          const dht::InfoHash&, const dht::SockAddr&) { return true; }));
  } catch (const std::exception& e) {
    throw CommError("swarm.listen=" + listen + ": the DHT cannot listen on UDP there: " + e.what(),
                    "pick a free port for swarm.listen (the DHT uses UDP, the frames TCP, on the same port)");
  }
  for (const auto& peer : initial_peers) {
    const auto [peer_host, peer_port] = split_host_port(peer, "swarm.initial_peers");
    dht_->bootstrap(peer_host, std::to_string(peer_port));
  }
  initial_peers_ = initial_peers;
  mine_address_ = listen;
  if (transport_)
    transport_->on_arrival(MessageKind::kRecord, [this](const Message& m) {
      for (const auto& [sealed, size] : detail::sealed_records(m.body)) take_in(sealed, size, m.sender);
      if (m.to_anyone) owe_record(m.sender);
    });
  if (transport_)
    transport_->on_foreign([this](const Message& m, const PeerKey& run_key) { take_in_foreign(m, run_key); });
  if (transport_) transport_->on_arrival(MessageKind::kDeal, [this](const Message& m) { take_in_deal(m); });
  thread_ = std::thread([this] { run(); });
}

Directory::~Directory() {
  if (transport_) transport_->on_arrival(MessageKind::kRecord, nullptr);
  if (transport_) transport_->on_arrival(MessageKind::kDeal, nullptr);
  if (transport_) transport_->on_foreign(nullptr);
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
  dht_->join();
}

void Directory::announce(PeerRecord mine, Reach reach) { announce(std::move(mine), reach, nullptr); }

void Directory::announce(PeerRecord mine, Reach reach, uint64_t* leave_no) {
  std::lock_guard lock(mutex_);
  if (leave_no) {
    *leave_no = ++leaves_asked_;
    mine_urgent_ = true;
  }
  mine.key = me_.token.peer_public_key;
  if (mine.step != mine_.step || mine.ready != mine_.ready || mine.leaving != mine_.leaving) mine_urgent_ = true;
  // A change of step or key goes to everyone, but for one the last round's leader dealt (Note [A leader
  // deals its groups over the next round's keys] in p2p/Matchmaking.cpp): the others heard of it there.
  const bool moved = mine.step != mine_.step || mine.group_key != mine_.group_key;
  const bool grid = reach == Reach::kGrid && grid_fixed(mine);
  const bool everyone = reach == Reach::kEveryone || mine.group_key == 0 || mine.leaving != mine_.leaving ||
                        (moved && reach != Reach::kDealt && !grid);
  if (everyone) {
    mine_to_everyone_ = true;
    ++everyone_version_;
  }
  if (grid) mine_to_grid_ = true;
  // Where its coordinates come to stay, the deal it made before stands no longer: its members' are staying
  // too, and it was re-sent as long as it named a member whose record here had not moved past the dealt step
  // (seen: a deal re-sent at step 26 of 30 on a 2 x 2 grid).
  if (grid_fixed(mine) && !grid_fixed(mine_)) standing_ = {};
  mine.digest_step = mine_.digest_step;
  mine.digest = mine_.digest;
  mine.session = session_;
  mine.started_unix = started_unix_;
  mine.features = PeerRecord::kPairFrames | PeerRecord::kPolyPairFrames | PeerRecord::kPartPieces |
                  PeerRecord::kTakesDeals | (options_.forms_grid ? PeerRecord::kFormsGrid : 0);
  mine_ = std::move(mine);
  mine_dirty_ = true;
  changed_.notify_all();
}

void Directory::announce_digest(int64_t step, uint64_t digest) {
  std::lock_guard lock(mutex_);
  mine_.digest_step = step;
  mine_.digest = digest;
  mine_dirty_ = true;
  mine_to_everyone_ = true;  // any peer on the step or behind compares digests (SwarmCatchUp.cpp's drifted_from)
  ++everyone_version_;
  changed_.notify_all();
}

std::vector<PeerRecord> Directory::peers() const { return written_since(detail::unix_now() - options_.record_ttl_s); }

bool Directory::any_live_peer() const {
  const double oldest = detail::unix_now() - options_.record_ttl_s;
  std::lock_guard lock(mutex_);
  for (const auto& [key, entry] : records_)
    if (key != me_.token.peer_public_key && entry.heard_unix() >= oldest && !entry.record.leaving) return true;
  return false;
}

std::vector<PeerRecord> Directory::written_since(double oldest_unix) const {
  std::lock_guard lock(mutex_);
  std::vector<PeerRecord> out;
  for (const auto& [key, entry] : records_)
    if (key != me_.token.peer_public_key && entry.heard_unix() >= oldest_unix && !entry.record.leaving) {
      out.push_back(entry.record);
      out.back().heard_unix = entry.heard_unix();
      out.back().taken_unix = entry.taken_unix;
      const auto deal = dealt_.find(key);
      if (deal != dealt_.end() && deal->second.key != 0 && deal->second.step > entry.record.step)
        out.back().dealt_step = deal->second.step, out.back().dealt_key = deal->second.key;
    }
  return out;
}

std::vector<PeerRecord> Directory::fresh_peers(double timeout_s) {
  {
    std::unique_lock lock(mutex_);
    // Of every record, not of a bucket (Note [The run's records in sixteen buckets]), and only while a caller
    // waits (Note [A newcomer reads a bucket at a time]).
    ++full_read_waiters_;
    const uint64_t after = reads_started_;  // a read that starts after this call
    changed_.wait_for(lock, duration<double>(timeout_s), [&] { return reads_ > after || stopping_; });
    --full_read_waiters_;
  }
  return peers();
}

void Directory::leave(PeerRecord mine, double timeout_s) {
  mine.leaving = true;
  uint64_t leave_no = 0;
  announce(std::move(mine), Reach::kEveryone, &leave_no);
  std::unique_lock lock(mutex_);
  changed_.wait_for(lock, duration<double>(timeout_s), [&] { return leaves_done_ >= leave_no || stopping_; });
}

int64_t Directory::dht_bytes_sent() const { return dht_sent_->load(); }

uint64_t Directory::dht_reads() const {
  std::lock_guard lock(mutex_);
  return reads_;
}

int64_t Directory::peers_seen() const {
  std::lock_guard lock(mutex_);
  return static_cast<int64_t>(seen_.size());
}

// Note [No DHT request before the first contact]
// A search started while this node knows no other (the
// first peer, before anyone bootstraps through it) backs off, and its first answer then takes seconds. So
// the DHT is neither read nor written before a first contact.
bool Directory::has_contact() const {
  const auto nodes = dht_->getNodesStats(AF_INET);
  return nodes.good_nodes + nodes.dubious_nodes + nodes.incoming_nodes > 0;
}

// Sends this peer's record to the peers it knows (Note [Records go to the peers directly]), puts it into
// the DHT every dht_put_s (seldom once it knows others) and when it leaves, and reads the DHT (read_gap).
void Directory::run() {
  auto last_direct = steady_clock::now() - std::chrono::hours(1);
  auto last_put = last_direct, last_read = last_direct, last_heartbeat = last_direct;
  const auto since = [](steady_clock::time_point t) { return duration<double>(steady_clock::now() - t).count(); };
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    std::vector<std::string> contacts;
    contacts.swap(to_contact_);
    std::set<PeerKey> owed;
    owed.swap(owed_);
    take_due_answers(owed);  // a record is sealed for them only if one is due
    const bool publishing = transport_ && !mine_.address.empty();
    // Note [The heartbeat is its own clock]
    // It is due announce_s after the last heartbeat, not after the
    // last record sent. A peer sends a record at every step, and with steps shorter than announce_s a
    // heartbeat counted from those never came: the others' records were never passed on, and a newcomer
    // knocking on one peer met that one alone (seen: 2 of 4 live peers, for a minute).
    const bool heartbeat = since(last_heartbeat) >= options_.announce_s;
    const bool direct_due =
        publishing && (mine_urgent_ || heartbeat || (mine_dirty_ && since(last_direct) >= kMinDirectGapS));
    const bool leaving_now = mine_urgent_ && mine_.leaving;
    const uint64_t leave_no = leaves_asked_;  // the leave() whose record this is, if leaving_now
    std::vector<uint8_t> sealed;
    const bool group_only = !heartbeat && !mine_to_everyone_;
    const bool grid_change = mine_to_grid_;  // to the peers that share a coordinate, not the key's alone
    PeerRecord record;                       // as sealed: send_direct filters on its step and key
    const uint64_t version = everyone_version_;
    const bool news = mine_dirty_;  // a heartbeat that carries a change skips nobody
    if (direct_due || (publishing && !owed.empty())) {
      record = mine_;
      record.written_unix = detail::unix_now();
      if (direct_due) {
        mine_dirty_ = mine_urgent_ = false;
        mine_to_grid_ = false;
        if (!group_only) mine_to_everyone_ = false;
      }
      sealed = seal(me_, PeerKey{}, next_counter(), detail::encode_record(record));
      mine_sealed_ = sealed;
    }
    lock.unlock();
    // Note [Every peer is a DHT contact]
    // A peer that bootstrapped through one peer may know only that one
    // in the DHT (its searches are answered there); when that peer dies, it finds nobody and trains alone
    // (measured: three peers alone for the rest of the run after their bootstrap peer was killed). Every
    // peer seen in a record is made a direct contact, so the swarm outlives any one peer.
    for (const auto& address : contacts) {
      try {
        const auto [host, port] = split_host_port(address, "a peer's record");
        dht_->bootstrap(host, std::to_string(port));
      } catch (const std::exception&) {
        // A signed record with an address that does not parse: that peer stays reachable through others.
      }
    }
    if (!sealed.empty() && !owed.empty()) answer(sealed, owed);
    if (!sealed.empty() && direct_due) {
      send_direct(sealed, version, heartbeat, heartbeat && !news, group_only && !grid_change ? &record : nullptr,
                  grid_fixed(record) ? &record : nullptr);
      if (heartbeat && !any_live_peer()) knock(sealed);
      last_direct = steady_clock::now();
      if (heartbeat) last_heartbeat = last_direct;
    }
    if (publishing) resend_deal();  // Note [A leader vouches for its members until its next round]
    const bool contact = has_contact();
    const bool knows_peers = publishing && any_live_peer();
    const double put_gap = knows_peers ? known_put_gap(options_) : options_.dht_put_s;
    const auto left = [this, leave_no] {  // leave() waits for this
      std::lock_guard held(mutex_);
      leaves_done_ = std::max(leaves_done_, leave_no);
      changed_.notify_all();
    };
    if (contact && !sealed.empty() && (leaving_now || since(last_put) >= put_gap)) {
      put(sealed, leaving_now ? std::function<void()>(left) : nullptr);
      last_put = steady_clock::now();
    } else if (leaving_now) {
      left();  // no DHT contact to put it through
    }
    // A peer with a transport reads as a newcomer before its first record too: read as an observer, its
    // first read brought every record (seen under ThreadSanitizer, whose slowness let the DHT's first
    // contact come before SwarmPeer's first announce).
    const bool peer = transport_ != nullptr;
    if (contact && since(last_read) >= read_gap(peer, knows_peers) && start_read(peer, knows_peers))
      last_read = steady_clock::now();
    lock.lock();
    changed_.wait_for(lock, duration<double>(kMinDirectGapS), [&] { return stopping_ || mine_urgent_; });
  }
}

}  // namespace cohort::p2p

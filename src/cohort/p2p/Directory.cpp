#include "cohort/p2p/Directory.h"

#include <opendht/dhtrunner.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <optional>
#include <random>

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
constexpr dht::ValueType::Id kRecordType = 0x4348;

using std::chrono::duration;
using std::chrono::steady_clock;

double unix_now() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

std::vector<uint8_t> encode(const PeerRecord& r) {
  Writer w;
  w.u8(1);  // the record's version: fields are only ever appended
  w.raw(r.key.data(), r.key.size()).str(r.address).i64(r.step).i64(r.samples).f64(r.samples_per_s);
  w.u8(r.ready ? 1 : 0).u8(r.leaving ? 1 : 0).f64(r.written_unix);
  w.i64(r.group_size);  // appended after version 1's fields: an older reader ignores it
  w.i64(r.digest_step).u64(r.digest);
  w.u64(r.session).f64(r.started_unix);
  w.u64(r.group_key);
  w.u64(r.features);
  return w.take();
}

std::optional<PeerRecord> decode(const std::vector<uint8_t>& payload, const PeerKey& signer) {
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
  // A record speaks for the peer that signed it only.
  if (!r.ok() || version < 1 || rec.key != signer) return std::nullopt;
  return rec;
}

uint64_t new_session() {
  std::random_device device;
  uint64_t session = 0;
  while (session == 0) session = (uint64_t{device()} << 32) | device();  // 0 is "a writer without sessions"
  return session;
}

std::string seconds_text(double s) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f s", s);
  return text;
}

// A record's body as a kRecord frame carries it: one sealed record with its length.
std::vector<uint8_t> record_body(const uint8_t* sealed, size_t size) {
  Writer w;
  w.u64(1).u64(size).raw(sealed, size);
  return w.take();
}

// The first sealed record of a kRecord body, or nothing.
std::optional<std::pair<const uint8_t*, size_t>> first_record(const std::vector<uint8_t>& body) {
  Reader r(body);
  if (r.u64() == 0 || !r.ok()) return std::nullopt;
  const uint64_t size = r.u64();
  const uint8_t* sealed = r.take(size);
  if (!sealed) return std::nullopt;
  return std::make_pair(sealed, static_cast<size_t>(size));
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
      key_("cohort-swarm/" + hex(run_public_key.data(), run_public_key.size())),
      session_(new_session()),
      started_unix_(unix_now()) {
  const auto [host, port] = split_host_port(listen, "swarm.listen");
  dht::DhtRunner::Config config;
  config.threaded = true;
  config.dht_config.node_config.is_bootstrap = false;
  const auto addresses = dht::SockAddr::resolve(host, std::to_string(port));
  if (addresses.empty())
    throw ConfigError("swarm.listen=" + listen + ": cannot resolve " + host, "give an address of this machine");
  config.bind4 = addresses.front();
  try {
    dht_->run(config, {});
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
      Reader r(m.body);
      for (uint64_t n = r.u64(), i = 0; i < n && r.ok(); ++i) {
        const uint64_t size = r.u64();
        if (const uint8_t* sealed = r.take(size)) take_in(sealed, size, m.sender);
      }
    });
  if (transport_)
    transport_->on_foreign([this](const Message& m, const PeerKey& run_key) { take_in_foreign(m, run_key); });
  thread_ = std::thread([this] { run(); });
}

Directory::~Directory() {
  if (transport_) transport_->on_arrival(MessageKind::kRecord, nullptr);
  if (transport_) transport_->on_foreign(nullptr);
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
  dht_->join();
}

void Directory::announce(PeerRecord mine) {
  std::lock_guard lock(mutex_);
  mine.key = me_.token.peer_public_key;
  if (mine.step != mine_.step || mine.ready != mine_.ready || mine.leaving != mine_.leaving) mine_urgent_ = true;
  mine.digest_step = mine_.digest_step;
  mine.digest = mine_.digest;
  mine.session = session_;
  mine.started_unix = started_unix_;
  mine.features = PeerRecord::kPairFrames | PeerRecord::kPolyPairFrames;
  mine_ = std::move(mine);
  mine_dirty_ = true;
  changed_.notify_all();
}

void Directory::announce_digest(int64_t step, uint64_t digest) {
  std::lock_guard lock(mutex_);
  mine_.digest_step = step;
  mine_.digest = digest;
  mine_dirty_ = true;
  changed_.notify_all();
}

std::vector<PeerRecord> Directory::peers() const { return written_since(unix_now() - options_.record_ttl_s); }

std::vector<PeerRecord> Directory::written_since(double oldest_unix) const {
  std::lock_guard lock(mutex_);
  std::vector<PeerRecord> out;
  for (const auto& [key, entry] : records_)
    if (key != me_.token.peer_public_key && entry.record.written_unix >= oldest_unix && !entry.record.leaving)
      out.push_back(entry.record);
  return out;
}

std::vector<PeerRecord> Directory::fresh_peers(double timeout_s) {
  {
    std::unique_lock lock(mutex_);
    const uint64_t after = reads_started_;  // a read that starts after this call
    changed_.wait_for(lock, duration<double>(timeout_s), [&] { return reads_ > after || stopping_; });
  }
  return peers();
}

int64_t Directory::peers_seen() const {
  std::lock_guard lock(mutex_);
  return static_cast<int64_t>(seen_.size());
}

std::string Directory::identity_taken() const {
  std::lock_guard lock(mutex_);
  return identity_taken_;
}

std::vector<Refusal> Directory::refusals() const {
  std::lock_guard lock(mutex_);
  std::vector<Refusal> out;
  for (const auto& [key, refusal] : refused_by_) out.push_back(refusal);
  return out;
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
// the DHT every dht_put_s and when it leaves, and reads the DHT every dht_read_s.
void Directory::run() {
  auto last_direct = steady_clock::now() - std::chrono::hours(1);
  auto last_put = last_direct, last_read = last_direct, last_heartbeat = last_direct;
  const auto since = [](steady_clock::time_point t) { return duration<double>(steady_clock::now() - t).count(); };
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    std::vector<std::string> contacts;
    contacts.swap(to_contact_);
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
    std::vector<uint8_t> sealed;
    if (direct_due) {
      PeerRecord record = mine_;
      record.written_unix = unix_now();
      mine_dirty_ = mine_urgent_ = false;
      sealed = seal(me_, PeerKey{}, next_counter(), encode(record));
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
    if (!sealed.empty()) {
      send_direct(sealed, heartbeat);
      if (heartbeat && peers().empty()) knock(sealed);
      last_direct = steady_clock::now();
      if (heartbeat) last_heartbeat = last_direct;
    }
    const bool contact = has_contact();
    if (contact && !sealed.empty() && (leaving_now || since(last_put) >= options_.dht_put_s)) {
      put(sealed);
      last_put = steady_clock::now();
    }
    const bool knows_peers = publishing && !peers().empty();
    if (contact && since(last_read) >= (knows_peers ? options_.dht_read_known_s : options_.dht_read_s)) {
      start_read();
      last_read = steady_clock::now();
    }
    lock.lock();
    changed_.wait_for(lock, duration<double>(kMinDirectGapS), [&] { return stopping_ || mine_urgent_; });
  }
}

// A kRecord frame's body: the number of records, then each sealed record with its length.
void Directory::send_direct(const std::vector<uint8_t>& mine, bool with_others) {
  std::vector<PeerRecord> to = with_others ? heartbeat_peers() : peers();
  std::vector<std::pair<PeerKey, std::vector<uint8_t>>> others;
  std::set<PeerKey> gossip_to;
  if (with_others) {
    std::lock_guard lock(mutex_);
    const double now = unix_now(), oldest = now - options_.record_ttl_s;
    for (const auto& [key, entry] : records_)
      if (key != me_.token.peer_public_key && entry.record.written_unix >= oldest) {
        others.emplace_back(key, entry.sealed);
        if (entry.met_unix >= now - kWelcomeBeats * options_.announce_s) gossip_to.insert(key);
      }
    // Note [The heartbeat passes on a few records]
    // Every record it knew went to every peer it knew, so
    // each peer checked the signatures of every other's records once a second from every other peer:
    // N^2 a peer, N^3 in all. At 32 peers on 2 cores that took most of the machine, and rounds failed for
    // want of CPU (bench/scale.py, issue 41). So a heartbeat passes on a random kGossipRecords of them,
    // drawn anew at each beat, and only to some peers: those it met in the last kWelcomeBeats beats (a
    // newcomer, or a peer back after its record expired here, learns the swarm from every peer that meets
    // it within a beat or two) and kGossipFanout others drawn at random (views that differ still merge).
    // Passed to every peer, the 8 records made the heartbeat 9 records a peer a second from each of N - 1
    // peers: 183 kB/s a peer at 64 peers against 67 at 8 (bench/scale.py); passed to a few, a peer at 64
    // sends 0.67 times what one at 8 does (paired runs: bench/results/scale.json). Every peer still hears
    // each live peer's own record from that peer every beat, which keeps each record live where it is known.
    if (others.size() > kGossipRecords) {
      std::shuffle(others.begin(), others.end(), gossip_random_);
      others.resize(kGossipRecords);
    }
    std::vector<PeerKey> live;
    for (const auto& peer : to)
      if (!gossip_to.count(peer.key) && peer.written_unix >= oldest) live.push_back(peer.key);
    std::shuffle(live.begin(), live.end(), gossip_random_);
    for (size_t i = 0; i < live.size() && i < kGossipFanout; ++i) gossip_to.insert(live[i]);
  }
  const double live_since = unix_now() - options_.record_ttl_s;
  for (const auto& peer : to) {
    Writer w;
    const bool gossip = gossip_to.count(peer.key) > 0;
    uint64_t count = 1;
    if (gossip)
      for (const auto& other : others) count += other.first != peer.key;
    w.u64(count).u64(mine.size()).raw(mine.data(), mine.size());
    if (gossip)
      for (const auto& [key, sealed] : others)
        if (key != peer.key) w.u64(sealed.size()).raw(sealed.data(), sealed.size());
    // To a peer whose record expired, addressed to whoever is there now, as a knock is: another process may
    // have taken its address.
    const bool live = peer.written_unix >= live_since;
    transport_->send(live ? peer.key : PeerKey{}, peer.address, {MessageKind::kRecord, 0, 0}, w.out());
  }
}

// Note [A peer whose record expired still hears the heartbeat]
// A record that arrives after its TTL (a machine so loaded that frames wait seconds in queues) makes its
// peer dead to the receiver, which then stopped sending to it; when both sides of a pair did so they never
// met again. At 64 peers on 2 cores a swarm split so in two for good: 23 peers waited 300 s for the other
// 41 to start, while those trained among themselves (bench/scale.py, issue 41). The heartbeat also goes
// to the peers whose last record expired less than kHeartbeatAfterDeathS ago (and that did not say they
// were leaving), so the two sides meet again at the first record that arrives in time; a dead peer costs
// a minute of heartbeats to its address (addressed to whoever is there, as a knock is). Changes of step or
// readiness go to the live peers only.
std::vector<PeerRecord> Directory::heartbeat_peers() const {
  return written_since(unix_now() - options_.record_ttl_s - kHeartbeatAfterDeathS);
}

// Note [A peer that knows nobody knocks]
// A peer that knows no live peer sends its record, every
// announce_s, to the addresses in swarm.initial_peers and to those of the peers it has seen (addressed to
// whoever is there: a newcomer does not know their keys yet). A live peer there takes it in like any record
// and, from its next heartbeat on, sends this peer its own record and every other it knows. Without it a
// peer found others only through the DHT, which in 1 of 3 runs of the four-peer test gave a newcomer
// nobody for a minute, and once left a peer that had lost its records for a few seconds alone to the end.
void Directory::knock(const std::vector<uint8_t>& mine) {
  std::set<std::string> addresses(initial_peers_.begin(), initial_peers_.end());
  {
    std::lock_guard lock(mutex_);
    for (const auto& [key, entry] : records_)
      if (key != me_.token.peer_public_key && !entry.record.leaving && addresses.size() < kMaxKnocks)
        addresses.insert(entry.record.address);
  }
  addresses.erase(mine_address_);
  Writer w;
  w.u64(1).u64(mine.size()).raw(mine.data(), mine.size());
  const auto body = w.take();
  for (const auto& address : addresses) transport_->send(PeerKey{}, address, {MessageKind::kRecord, 0, 0}, body);
}

void Directory::put(const std::vector<uint8_t>& sealed) {
  auto value = std::make_shared<dht::Value>(sealed.data(), sealed.size());
  // One value id per peer, so a peer's newer record replaces its older one on the nodes that store it.
  uint64_t id = 0;
  for (int i = 0; i < 8; ++i) id = (id << 8) | me_.token.peer_public_key[static_cast<size_t>(i)];
  value->id = id;
  value->type = kRecordType;
  dht_->put(dht::InfoHash::get(key_), value, [](bool) {});
}

// Reads every record of the run from the DHT without waiting: the answers arrive on OpenDHT's thread.
void Directory::start_read() {
  {
    std::lock_guard lock(mutex_);
    if (read_in_flight_) return;
    read_in_flight_ = true;
    ++reads_started_;
  }
  dht_->get(
      dht::InfoHash::get(key_),
      [this](const std::vector<std::shared_ptr<dht::Value>>& values) {
        for (const auto& value : values)
          if (value) take_in(value->data.data(), value->data.size(), PublicKey{});
        return true;
      },
      [this](bool) {
        std::lock_guard lock(mutex_);
        read_in_flight_ = false;
        ++reads_;
        changed_.notify_all();
      });
}

void Directory::take_in(const uint8_t* data, size_t size, const PeerKey& carrier) {
  // Most records a heartbeat passes on are already here, at the same counter: dropped before their
  // signature is checked (Note [A token's signature is checked once] in p2p/Auth.cpp says what that costs).
  if (const auto claimed = claimed_header(data, size)) {
    std::lock_guard lock(mutex_);
    const auto held = records_.find(claimed->peer);
    if (held != records_.end() && claimed->counter <= held->second.counter) return;
  }
  auto opened = open_carried(data, size, run_public_key_, static_cast<int64_t>(std::time(nullptr)), carrier);
  if (auto* why = std::get_if<std::string>(&opened)) {
    const std::string line = "swarm: refused a record from peer " + claimed_sender(data, size) + ": " + *why;
    std::unique_lock lock(mutex_);
    if (!refused_logged_.insert(line).second) return;
    lock.unlock();
    log_(line);
    return;
  }
  auto& o = std::get<Opened>(opened);
  auto rec = decode(o.payload, o.token.peer_public_key);
  if (!rec) return;
  Replies replies;
  {
    std::lock_guard lock(mutex_);
    if (rec->key == me_.token.peer_public_key) {
      take_in_own_key(*rec, replies);
    } else {
      auto& slot = records_[rec->key];
      if (o.counter <= slot.counter) return;
      introduce_twins(slot, *rec, data, size, replies);
      if (!rec->leaving && seen_.insert(rec->key).second) to_contact_.push_back(rec->address);
      if (transport_ && (rec->features & PeerRecord::kPairFrames))
        transport_->reads_pair_frames(
            rec->key, rec->features & PeerRecord::kPolyPairFrames ? PairMac::kPoly1305 : PairMac::kBlake2b);
      const double now = unix_now();
      const bool met = slot.record.written_unix < now - options_.record_ttl_s;
      slot = {o.counter, std::move(*rec), std::vector<uint8_t>(data, data + size), met ? now : slot.met_unix};
    }
  }
  if (transport_)
    for (const auto& [address, body] : replies)
      transport_->send(PeerKey{}, address, {MessageKind::kRecord, 0, 0}, body);
}

// Note [One identity, one process]
// A token is one peer's identity. Given to two live processes (one token file copied to every machine),
// both announce one key: the others' records of it replace each other, each process takes the other's
// records for its own and ignores them, and every one of them trained alone, saying nothing (seen: three
// peers, each alone for a whole run). A peer restarted with its own token, after Ctrl-C or a crash within
// swarm.peer_ttl_s, announces the same key too, and must rejoin. A record says which process wrote it (a
// random session number) and when that process started:
// - A record of this key from another session that is leaving, or that was written before this process
//   started, is a predecessor's (after Ctrl-C, or a crash): no conflict.
// - Written after this process started by a process that started before it: the identity is taken.
//   This process stops, naming the fix (a token per peer): identity_taken(), which SwarmPeer checks
//   between steps. (Clocks of one machine, or of machines within the frames' 120 s replay window: a
//   restart on another machine whose clock runs ahead of the old one's could be taken for a twin.)
// - From a process that started after this one: this one goes on, logs it once, and answers with its
//   own record, so that the newer process learns the same within a heartbeat.
// Each process finds the other by knocking (it knows no live peer: every record it sees is its own
// key's) on its initial peers. When a third peer gets the key's records from both, it introduces them
// to each other (introduce_twins): each is sent the other's record.
void Directory::take_in_own_key(const PeerRecord& rec, Replies& replies) {
  if (rec.session == 0 || rec.session == session_ || rec.leaving) return;
  const bool it_is_older =
      rec.started_unix < started_unix_ || (rec.started_unix == started_unix_ && rec.session < session_);
  if (it_is_older) {
    if (rec.written_unix > started_unix_ && identity_taken_.empty())
      identity_taken_ = "peer " + peer_name(rec.key) + " is already live at " + rec.address +
                        ", in another process that started " + seconds_text(started_unix_ - rec.started_unix) +
                        " before this one with the same identity";
    return;
  }
  const double now = unix_now();
  auto [at, first] = twins_answered_.try_emplace(rec.session, 0.0);
  if (first)
    log_("swarm: another process at " + rec.address + " uses this peer's identity (peer " + peer_name(rec.key) +
         ", the same swarm.token): it is told, and stops");
  if (now - at->second < options_.announce_s || mine_sealed_.empty()) return;
  at->second = now;
  replies.emplace_back(rec.address, record_body(mine_sealed_.data(), mine_sealed_.size()));
}

void Directory::introduce_twins(const Entry& held, const PeerRecord& rec, const uint8_t* data, size_t size,
                                Replies& replies) {
  const auto& old = held.record;
  if (held.sealed.empty() || old.session == 0 || rec.session == 0 || old.session == rec.session || old.leaving ||
      rec.leaving || old.written_unix < unix_now() - options_.record_ttl_s)
    return;
  // Each written after the other started: two live processes, not a restart after a crash.
  if (old.written_unix <= rec.started_unix || rec.written_unix <= old.started_unix) return;
  const double now = unix_now();
  auto& when = introduced_[{std::min(old.session, rec.session), std::max(old.session, rec.session)}];
  if (now - when < options_.announce_s) return;
  if (when == 0)
    log_("swarm: peer " + peer_name(rec.key) + " announces itself from two processes, at " + old.address + " and " +
         rec.address + " (one swarm.token in both): introducing them, so that the newer one stops");
  when = now;
  replies.emplace_back(rec.address, record_body(held.sealed.data(), held.sealed.size()));
  replies.emplace_back(old.address, record_body(data, size));
}

// Note [A peer of another run is told so]
// A peer whose token another run key signed (a token made with the wrong run.key, or swarm.insecure on
// one side only) is refused by every peer of this run: its frames are not this run's. It used to learn
// nothing (its DHT key is its own run's, where nobody is), and trained alone to the end. So a peer that
// refuses a knocking peer's record for being of another run answers it, at most every announce_s, with a
// kRefused frame sealed by its own token: a token of a run the knocking peer does not accept either, but
// one that proves the frame came from a peer of *that* run (open_as_its_run). The refused peer records
// who refused it and for which run key (refusals()); SwarmPeer stops it when such refusals are all it
// met. A refusal changes no state a run has: at worst, a forged one stops a peer that had met nobody.
void Directory::take_in_foreign(const Message& m, const PeerKey& run_key) {
  const double now = unix_now();
  const std::string run = hex(run_key.data(), 4);
  if (m.topic.kind == MessageKind::kRefused) {
    Reader r(m.body);
    const auto address = r.str();
    std::unique_lock lock(mutex_);
    const bool first = refused_by_.find(m.sender) == refused_by_.end();
    refused_by_[m.sender] = {m.sender, r.ok() ? address : "an unknown address", run_key};
    lock.unlock();
    if (first)
      log_("swarm: peer " + peer_name(m.sender) + " at " + address + " refuses this peer: it belongs to run key " +
           run + "..., and this peer's token to run key " + hex(run_public_key_.data(), 4) + "...");
    return;
  }
  // A record of another run: whose, and where to answer.
  const auto sealed = first_record(m.body);
  if (!sealed) return;
  auto opened = open_as_its_run(sealed->first, sealed->second, static_cast<int64_t>(std::time(nullptr)));
  auto* o = std::get_if<Opened>(&opened);
  if (!o) return;
  auto rec = decode(o->payload, o->token.peer_public_key);
  if (!rec || rec->key != m.sender || rec->address.empty()) return;
  std::string address;
  {
    std::lock_guard lock(mutex_);
    auto [at, first] = refusal_sent_.try_emplace(m.sender, 0.0);
    if (now - at->second < options_.announce_s) return;
    at->second = now;
    address = mine_.address;
    if (first)
      log_("swarm: refused peer " + peer_name(m.sender) + " at " + rec->address +
           ": its token belongs to another run (run key " + run + "...); it is told so");
  }
  if (address.empty()) return;  // an observer answers nobody
  Writer w;
  w.str(address);
  transport_->send(m.sender, rec->address, {MessageKind::kRefused, 0, 0}, w.take());
}

}  // namespace cohort::p2p

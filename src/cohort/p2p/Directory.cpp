#include "cohort/p2p/Directory.h"

#include <opendht/dhtrunner.h>
#include <algorithm>
#include <chrono>
#include <ctime>
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
      key_("cohort-swarm/" + hex(run_public_key.data(), run_public_key.size())),
      session_(new_session()),
      started_unix_(detail::unix_now()) {
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

void Directory::announce(PeerRecord mine, Reach reach) {
  std::lock_guard lock(mutex_);
  mine.key = me_.token.peer_public_key;
  if (mine.step != mine_.step || mine.ready != mine_.ready || mine.leaving != mine_.leaving) mine_urgent_ = true;
  // A change of step or key goes to everyone, but for one the last round's leader dealt (Note [A leader
  // deals its groups over the next round's keys] in p2p/Matchmaking.cpp): the others heard of it there.
  const bool moved = mine.step != mine_.step || mine.group_key != mine_.group_key;
  const bool everyone = reach == Reach::kEveryone || mine.group_key == 0 || mine.leaving != mine_.leaving ||
                        (moved && reach != Reach::kDealt);
  if (everyone) {
    mine_to_everyone_ = true;
    ++everyone_version_;
  }
  mine.digest_step = mine_.digest_step;
  mine.digest = mine_.digest;
  mine.session = session_;
  mine.started_unix = started_unix_;
  mine.features =
      PeerRecord::kPairFrames | PeerRecord::kPolyPairFrames | PeerRecord::kPartPieces | PeerRecord::kTakesDeals;
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

std::vector<PeerRecord> Directory::written_since(double oldest_unix) const {
  std::lock_guard lock(mutex_);
  std::vector<PeerRecord> out;
  for (const auto& [key, entry] : records_)
    if (key != me_.token.peer_public_key && entry.heard_unix() >= oldest_unix && !entry.record.leaving) {
      out.push_back(entry.record);
      out.back().heard_unix = entry.heard_unix();
      const auto deal = dealt_.find(key);
      if (deal != dealt_.end() && deal->second.key != 0 && deal->second.step > entry.record.step)
        out.back().dealt_step = deal->second.step, out.back().dealt_key = deal->second.key;
    }
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
    std::set<PeerKey> owed;
    owed.swap(owed_);
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
    const bool group_only = !heartbeat && !mine_to_everyone_;
    PeerRecord record;  // as sealed: send_direct filters on its step and key
    const uint64_t version = everyone_version_;
    const bool news = mine_dirty_;  // a heartbeat that carries a change skips nobody
    if (direct_due || (publishing && !owed.empty())) {
      record = mine_;
      record.written_unix = detail::unix_now();
      if (direct_due) {
        mine_dirty_ = mine_urgent_ = false;
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
    if (!sealed.empty()) answer(sealed, owed);
    if (!sealed.empty() && direct_due) {
      send_direct(sealed, version, heartbeat, heartbeat && !news, group_only ? &record : nullptr);
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

// Note [Readiness goes to the group]
// Every change of a record went to every live peer: at each step a peer's step and then its readiness,
// 2 (N - 1) frames a peer a step (issue 41). With swarm.group_size, only the peers of its group key on its
// step read its readiness (the leader's survey in p2p/Matchmaking.cpp), and the others' count toward the
// target batch does not change when it turns ready: a peer on the step that is not ready counts as its
// samples plus a batch, one that is ready as its samples (SwarmPeer::ready), and a peer turns ready when
// its batch is in. (The batch counted is the reader's own: with peers of unequal batches the count is
// off by the difference until the next heartbeat or step, where before it was exact within milliseconds.)
// So a change announced with Reach::kGroup (readiness, and the samples that make a peer ready) goes to
// those peers only, and to the others with the next heartbeat that goes to them (Note [A heartbeat skips
// the peers that heard this one lately]) or the next change of step. A change of step, leaving or
// group key still goes to everyone at once (a leader waits for any peer one step behind, which may come
// to its key), but for one its last round's leader dealt and told the others of (Reach::kDealt: Note [A
// leader deals its groups over the next round's keys] in p2p/Matchmaking.cpp). A peer that comes to the key after the
// ready one announced is told by matchmaking's ready message (Averager::tell_ready). Without swarm.group_size every key
// is 0 and every change goes to everyone, as before.
//
// To every peer in `to` a kRecord frame of this peer's record and, on a heartbeat to a few of them, some
// others' (Note [The heartbeat passes on a few records]).
void Directory::send_direct(const std::vector<uint8_t>& mine, uint64_t version, bool with_others, bool skip_heard,
                            const PeerRecord* group_of) {
  std::vector<PeerRecord> to = with_others ? heartbeat_peers() : peers();
  if (group_of) {
    // A peer dealt to this step and key is on its way there, whatever its record says yet.
    const auto elsewhere = [&](const PeerRecord& record) {
      const auto p = as_dealt(record);
      return p.step != group_of->step || p.group_key != group_of->group_key;
    };
    to.erase(std::remove_if(to.begin(), to.end(), elsewhere), to.end());
  }
  const double live_since = detail::unix_now() - options_.record_ttl_s;
  const auto now = steady_clock::now();
  std::vector<std::pair<PeerKey, std::vector<uint8_t>>> others;
  std::set<PeerKey> gossip_to;
  if (with_others) others = gossip(to, gossip_to);
  if (skip_heard) {
    const bool vouched = vouched_lately(now);
    to.erase(std::remove_if(to.begin(), to.end(),
                            [&](const PeerRecord& p) {
                              return !gossip_to.count(p.key) && p.heard_unix >= live_since &&
                                     (heard_lately(p.key, version, now) ||
                                      (vouched && (p.features & PeerRecord::kTakesDeals)));
                            }),
             to.end());
  }
  for (const auto& peer : to) {
    std::vector<detail::SealedRecord> records{{mine.data(), mine.size()}};
    if (gossip_to.count(peer.key))
      for (const auto& [key, sealed] : others)
        if (key != peer.key) records.emplace_back(sealed.data(), sealed.size());
    // To a peer whose record expired, addressed to whoever is there now, as a knock is: another process may
    // have taken its address.
    const bool live = peer.heard_unix >= live_since;
    transport_->send(live ? peer.key : PeerKey{}, peer.address, {MessageKind::kRecord, 0, 0},
                     detail::records_body(records));
    if (!with_others) sent_[peer.key] = {now, version};  // a heartbeat never excuses the next one
  }
}

// Note [A heartbeat skips the peers that heard this one lately]
// The heartbeat went to every live peer every announce_s, on top of each change of step, which also goes
// to every live peer: with steps shorter than announce_s it told each peer nothing a step had not told it
// half a second before, and it was N - 1 frames a peer a second, about half a peer's record frames at 64
// peers (bench/scale.py, issue 41). So it skips a live peer that, within record_ttl_s / 2 - announce_s,
// was sent a change of this peer's record (not a heartbeat: each beat would then excuse the next, halving
// the rate of an idle peer's) with every change meant for everyone (everyone_version_): that peer's copy
// is then never older than half a TTL when the next beat is due, and it holds all that a heartbeat would
// tell it but the changes sent to the group only (Note [Readiness goes to the group]), which the others do
// not read. Still sent the heartbeat: the peers it passes records on to (the newly met among them), the
// peers whose record here expired (Note [A peer whose record expired still hears the heartbeat]), every
// peer when the heartbeat carries a change not yet sent (readiness due to the group would otherwise wait
// for the next beat), and every peer while this one's steps are slower than that: a swarm stepping once a
// second or faster sends heartbeats only to the few it gossips to. The window is on the steady clock, so a
// step of the wall clock neither stretches nor cuts it.
bool Directory::heard_lately(const PeerKey& peer, uint64_t version, steady_clock::time_point now) const {
  const auto sent = sent_.find(peer);
  const duration<double> window(options_.record_ttl_s / 2 - options_.announce_s);
  return sent != sent_.end() && sent->second.version == version && now - sent->second.at < window;
}

// Note [A deal vouches for its members]
// With swarm.group_size a change of step goes to the new key's peers only, the others told by the deal
// (Note [A leader deals its groups over the next round's keys] in p2p/Matchmaking.cpp), so the heartbeat
// went each second to every live peer outside the key: N - g frames a peer a second, the directory's
// last cost that grew with the swarm in every second (docs/scaling.md, "Where it stops"). Those peers read
// nothing in it that the deal did not tell them: the step and key it goes to (as_dealt), and that it is
// there. Its readiness and samples they do not read (Note [Readiness goes to the group]), and a change
// meant for everyone still goes to everyone at once. So a live leader's deal vouches for its members: each
// peer that hears it holds the members' records live for record_ttl_s from then, as if each had sent its
// own (PeerRecord::heard_unix), and a member that a deal named (heard as the others do: the leader sends it
// to its members too) skips, in its heartbeats for the same window as Note [A heartbeat skips the peers
// that heard this one lately], the live peers that read deals. A swarm whose rounds come every second or
// faster then sends, outside each key, a deal a group a round (N / g frames a peer a round) and the
// gossip's few heartbeats, where it sent N - g heartbeats a second. Still sent the heartbeat: the gossip's
// peers, peers of an earlier release (they do not read deals), peers whose record here expired (Note [A
// peer whose record expired still hears the heartbeat]: two peers that lost each other meet again), and
// every peer once no deal named this one for the window (a round that failed, or none: DiLoCo between
// its outer rounds). A peer the leader did not know hears no deal, and loses the members' records a TTL
// later; its heartbeat, which goes to expired peers too, then reaches them addressed to nobody, and they
// answer it with their record (Note [A heartbeat to nobody is answered]). A deal is believed from a live
// peer of the run only (its frame is sealed by its sender), only for a step ahead of the member's record
// (a later record says more), and only if no later deal for it came first (a late one would bring a
// dead member back). The gossip passes on the records live here, if only by a deal, so that a newcomer
// holds them for the deals to vouch for. Catch-up reads a donor's step as dealt (SwarmCatchUp.cpp).
bool Directory::vouched_lately(steady_clock::time_point now) const {
  std::lock_guard lock(mutex_);
  return now - vouched_ < duration<double>(options_.record_ttl_s / 2 - options_.announce_s);
}

// Note [A heartbeat to nobody is answered]
// A peer whose record expired somewhere still hears that peer's heartbeat, addressed to whoever listens
// at its address (Note [A peer whose record expired still hears the heartbeat]), and the frame says so: it
// is not addressed to this peer's key. So this peer answers it with its record, at most every
// kMinAnswerGapS a peer. Without it, a member that deals vouch for skipped a peer that had lost its
// record for as long as the deals went on, since that peer heard no deal naming it (its leader did not
// know the peer, or the peer had lost the leader too: Note [A deal vouches for its members]), and only the
// gossip, at random, brought it back; a newcomer's knock is answered the same way.
void Directory::owe_record(const PeerKey& to) {
  std::lock_guard lock(mutex_);
  if (to == me_.token.peer_public_key) return;
  owed_.insert(to);
  changed_.notify_all();
}

void Directory::answer(const std::vector<uint8_t>& mine, const std::set<PeerKey>& owed) {
  const auto now = steady_clock::now();
  const double live_since = detail::unix_now() - options_.record_ttl_s;
  const auto body = detail::records_body({{mine.data(), mine.size()}});
  for (const auto& peer : written_since(0)) {
    if (!owed.count(peer.key)) continue;
    auto& last = answered_[peer.key];
    if (now - last < duration<double>(kMinAnswerGapS)) continue;
    last = now;
    transport_->send(peer.heard_unix >= live_since ? peer.key : PeerKey{}, peer.address, {MessageKind::kRecord, 0, 0},
                     body);
  }
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
// each live peer's own record from that peer at least every half TTL, which keeps each record live where
// it is known (Note [A heartbeat skips the peers that heard this one lately]).
std::vector<std::pair<PeerKey, std::vector<uint8_t>>> Directory::gossip(const std::vector<PeerRecord>& to,
                                                                        std::set<PeerKey>& gossip_to) {
  std::vector<std::pair<PeerKey, std::vector<uint8_t>>> others;
  std::lock_guard lock(mutex_);
  const double now = detail::unix_now(), oldest = now - options_.record_ttl_s;
  for (const auto& [key, entry] : records_)
    // Live here, if only by a deal: a peer that takes in a record older than its TTL holds it for the
    // deals to vouch for, and heartbeats it, addressed to nobody, until it answers (Notes [A deal vouches
    // for its members] and [A heartbeat to nobody is answered]).
    if (key != me_.token.peer_public_key && entry.heard_unix() >= oldest) {
      others.emplace_back(key, entry.sealed);
      if (entry.met_unix >= now - kWelcomeBeats * options_.announce_s) gossip_to.insert(key);
    }
  if (others.size() > kGossipRecords) {
    std::shuffle(others.begin(), others.end(), gossip_random_);
    others.resize(kGossipRecords);
  }
  std::vector<PeerKey> live;
  for (const auto& peer : to)
    if (!gossip_to.count(peer.key) && peer.heard_unix >= oldest) live.push_back(peer.key);
  std::shuffle(live.begin(), live.end(), gossip_random_);
  for (size_t i = 0; i < live.size() && i < kGossipFanout; ++i) gossip_to.insert(live[i]);
  return others;
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
  return written_since(detail::unix_now() - options_.record_ttl_s - kHeartbeatAfterDeathS);
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
  const auto body = detail::records_body({{mine.data(), mine.size()}});
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

}  // namespace cohort::p2p

#include "cohort/swarm/Directory.h"

#include <opendht/dhtrunner.h>
#include <chrono>
#include <ctime>

#include "cohort/swarm/Wire.h"
#include "cohort/util/Error.h"

namespace cohort::swarm {

namespace {

// The DHT value type of a peer record. Note [A peer's record is edited in place]: OpenDHT's default type
// refuses to replace a stored value with a new one of the same id (its edit policy is "never"), and
// keeps every value for 10 minutes, so a peer's updates would never reach the nodes that store its
// first record. Every cohort node registers this type: a record may be replaced (a forged replacement
// is still refused by whoever reads it: records are sealed) and expires soon after its peer stops
// republishing it.
constexpr dht::ValueType::Id kRecordType = 0x4348;

double unix_now() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

std::vector<uint8_t> encode(const PeerRecord& r) {
  Writer w;
  w.u8(1);  // the record's version: fields are only ever appended
  w.raw(r.key.data(), r.key.size()).str(r.address).i64(r.step).i64(r.samples).f64(r.samples_per_s);
  w.u8(r.ready ? 1 : 0).u8(r.leaving ? 1 : 0).f64(r.written_unix);
  return w.take();
}

}  // namespace

Directory::Directory(PeerIdentity me, PeerKey run_public_key, const std::string& listen,
                     const std::vector<std::string>& initial_peers, DirectoryOptions options,
                     std::function<void(const std::string&)> log)
    : me_(std::move(me)),
      run_public_key_(run_public_key),
      options_(options),
      log_(std::move(log)),
      dht_(std::make_unique<dht::DhtRunner>()),
      key_("cohort-swarm/" + hex(run_public_key.data(), run_public_key.size())) {
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
    const auto keep = std::chrono::seconds(static_cast<int64_t>(std::max(10.0, 2 * options_.record_ttl_s)));
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
  thread_ = std::thread([this] { run(); });
}

Directory::~Directory() {
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
  mine_ = std::move(mine);
  mine_dirty_ = true;
  changed_.notify_all();
}

std::vector<PeerRecord> Directory::peers() const {
  std::lock_guard lock(mutex_);
  const double oldest = unix_now() - options_.record_ttl_s;
  std::vector<PeerRecord> live;
  for (const auto& [key, entry] : records_)
    if (key != me_.token.peer_public_key && entry.second.written_unix >= oldest && !entry.second.leaving)
      live.push_back(entry.second);
  return live;
}

std::vector<PeerRecord> Directory::fresh_peers(double timeout_s) {
  {
    std::unique_lock lock(mutex_);
    const uint64_t after = reads_ + 1;  // a read that started after this call
    changed_.wait_for(lock, std::chrono::duration<double>(timeout_s), [&] { return reads_ > after || stopping_; });
  }
  return peers();
}

int64_t Directory::peers_seen() const {
  std::lock_guard lock(mutex_);
  return static_cast<int64_t>(seen_.size());
}

// Publishes this peer's record when it changed (at most every refresh_s) or every announce_s, and reads
// every record of the run every refresh_s.
void Directory::run() {
  using namespace std::chrono;
  auto last_publish = steady_clock::now() - hours(1);
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    // Note [No DHT request before the first contact]: a search started while this node knows no other
    // (the first peer, before anyone bootstraps through it) backs off, and its first answer then takes
    // seconds. So the first peer waits for a contact before it reads or writes.
    const auto nodes = dht_->getNodesStats(AF_INET);
    if (nodes.good_nodes + nodes.dubious_nodes + nodes.incoming_nodes == 0) {
      changed_.wait_for(lock, duration<double>(options_.refresh_s), [&] { return stopping_; });
      continue;
    }
    const bool due = duration<double>(steady_clock::now() - last_publish).count() >= options_.announce_s;
    if ((mine_dirty_ || due) && !mine_.address.empty()) {
      PeerRecord record = mine_;
      mine_dirty_ = false;
      lock.unlock();
      record.written_unix = unix_now();
      publish(record);
      last_publish = steady_clock::now();
      lock.lock();
    }
    lock.unlock();
    read();
    lock.lock();
    changed_.wait_for(lock, duration<double>(options_.refresh_s), [&] { return stopping_; });
  }
}

void Directory::publish(const PeerRecord& record) {
  auto sealed = seal(me_, PeerKey{}, next_counter(), encode(record));
  auto value = std::make_shared<dht::Value>(sealed.data(), sealed.size());
  // One value id per peer, so a peer's newer record replaces its older one on the nodes that store it.
  uint64_t id = 0;
  for (int i = 0; i < 8; ++i) id = (id << 8) | record.key[static_cast<size_t>(i)];
  value->id = id;
  value->type = kRecordType;
  dht_->put(dht::InfoHash::get(key_), value, [](bool) {});
}

void Directory::read() {
  auto future = dht_->get(dht::InfoHash::get(key_));
  if (future.wait_for(std::chrono::seconds(2)) != std::future_status::ready) return;
  std::vector<std::pair<uint64_t, PeerRecord>> fresh;
  for (const auto& value : future.get()) {
    if (!value) continue;
    const auto& data = value->data;
    auto opened = open(data.data(), data.size(), run_public_key_, static_cast<int64_t>(std::time(nullptr)));
    if (auto* why = std::get_if<std::string>(&opened)) {
      std::lock_guard lock(mutex_);
      const std::string line =
          "swarm: refused a DHT record from peer " + claimed_sender(data.data(), data.size()) + ": " + *why;
      if (refused_logged_.insert(line).second) log_(line);
      continue;
    }
    auto& o = std::get<Opened>(opened);
    Reader r(o.payload);
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
    // A record speaks for the peer that signed it only.
    if (!r.ok() || version < 1 || rec.key != o.token.peer_public_key) continue;
    fresh.emplace_back(o.counter, std::move(rec));
  }
  std::lock_guard lock(mutex_);
  for (auto& [counter, rec] : fresh) {
    auto& slot = records_[rec.key];
    if (counter > slot.first) {
      if (rec.key != me_.token.peer_public_key && !rec.leaving) seen_.insert(rec.key);
      slot = {counter, std::move(rec)};
    }
  }
  ++reads_;
  changed_.notify_all();
}

}  // namespace cohort::swarm

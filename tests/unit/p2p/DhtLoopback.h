// The DHT beside swarm peers on loopback (SwarmLoopback.h), for the directory's DHT tests: a bare OpenDHT
// node (a reader, a peer of an earlier release, or a DHT no peer listens at), records put and read by it,
// and two peers that met. Shared by test_directory_dht.cpp and test_directory_dht_reads.cpp; each test
// there takes hosts no other test uses.
//
//   MetPair pair(run, 200, logs, puts_often());
//   put_record(pair.bare, run, p2p::issue_token(run, 1h, now_unix()), 203, 7, /*bucket=*/3);
#pragma once

#if COHORT_HAVE_SWARM

#include <algorithm>
#include <future>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <opendht/dhtrunner.h>

#include "cohort/p2p/Directory.h"
#include "unit/p2p/SwarmLoopback.h"

namespace cohort::p2p::loopback {

// Records that change only when announced (no_heartbeat_within_a_test), put into the DHT every 0.5 s.
inline p2p::DirectoryOptions puts_often() {
  auto d = no_heartbeat_within_a_test();
  d.dht_put_s = 0.5;
  return d;
}

// A bare OpenDHT node at 127.0.0.<host> that knows the one at 127.0.0.<bootstrap> (none: `host` itself): a
// reader, a peer of an earlier release, or a DHT that no peer listens at, beside the directories.
inline void start_bare_dht_node(dht::DhtRunner& node, int host, int bootstrap) {
  dht::DhtRunner::Config config;
  config.threaded = true;
  config.bind4 = dht::SockAddr::resolve("127.0.0." + std::to_string(host), std::to_string(base_port() + host)).front();
  node.run(config, {});
  if (bootstrap != host)
    node.bootstrap("127.0.0." + std::to_string(bootstrap), std::to_string(base_port() + bootstrap));
}

// The DHT key of a run's records.
inline dht::InfoHash run_dht_key(const p2p::RunKey& run) {
  return dht::InfoHash::get(p2p::detail::dht_run_key(run.public_key));
}

// A live record of the run for `id`, with the address 127.0.0.<host> (a peer makes a DHT contact of every peer
// it sees: give the bare node's, or one where nothing listens), put by the bare node `bare` under `value_id`:
// named by `bucket`, or by none as a peer of an earlier release puts it (only a read of every record finds
// that). Returns once the put completed.
inline void put_record(dht::DhtRunner& bare, const p2p::RunKey& run, const p2p::PeerIdentity& id, int host,
                       uint64_t value_id, int bucket = -1) {
  p2p::PeerRecord record{{}, "127.0.0." + std::to_string(host) + ":" + std::to_string(base_port() + host), 9, 0, 1.0};
  record.key = id.token.peer_public_key;
  record.written_unix = now_unix();  // live for the whole test (record_ttl_s is 60)
  const auto sealed = p2p::seal(id, p2p::PeerKey{}, p2p::next_counter(), p2p::detail::encode_record(record));
  auto value = std::make_shared<dht::Value>(sealed.data(), sealed.size());
  value->id = value_id;
  value->type = p2p::detail::kDhtRecordType;
  if (bucket >= 0) value->user_type = p2p::detail::dht_bucket_name(bucket);
  std::promise<void> stored;
  bare.put(run_dht_key(run), value, [&stored](bool) { stored.set_value(); });
  stored.get_future().get();
}

// The same for a new peer of an earlier release; returns its key.
inline p2p::PeerKey put_old_record(dht::DhtRunner& bare, const p2p::RunKey& run, int host, uint64_t value_id) {
  const auto old = p2p::issue_token(run, 1h, now_unix());
  put_record(bare, run, old, host, value_id);
  return old.token.peer_public_key;
}

// The values of DHT value id `id` under the run's key that a read from `node` brings (of the bucket `where`
// names, if any): each node's copy.
inline std::vector<std::vector<uint8_t>> dht_values(dht::DhtRunner& node, const p2p::RunKey& run, uint64_t id,
                                                    dht::Where where = {}) {
  std::promise<std::vector<std::vector<uint8_t>>> got;
  auto data = std::make_shared<std::vector<std::vector<uint8_t>>>();
  node.get(
      run_dht_key(run),
      [data, id](const std::vector<std::shared_ptr<dht::Value>>& values) {
        for (const auto& value : values)
          if (value && value->id == id) data->push_back(value->data);
        return true;
      },
      [data, &got](bool) { got.set_value(*data); }, {}, std::move(where));
  return got.get_future().get();
}

// Two peers, a at 127.0.0.<host> and c at <host> + 1, that met through a, and a bare OpenDHT node at <host> + 2
// that knows a: a reader of the DHT, or a peer of an earlier release.
struct MetPair {
  MetPair(const p2p::RunKey& run, int host, Logs& logs, const p2p::DirectoryOptions& d)
      : a(run, host, "", logs, d), c(run, host + 1, a.transport.address(), logs, d) {
    met = meet({{&a, {{}, a.transport.address(), 1, 0, 1.0}}, {&c, {{}, c.transport.address(), 1, 0, 1.0}}});
    start_bare_dht_node(bare, host + 2, host);
  }
  ~MetPair() { bare.join(); }
  Peer a, c;
  bool met = false;
  dht::DhtRunner bare;
};

// Whether `directory` holds a record of `key`.
inline bool knows(const p2p::Directory& directory, const p2p::PeerKey& key) {
  const auto peers = directory.peers();
  return std::any_of(peers.begin(), peers.end(), [&](const p2p::PeerRecord& p) { return p.key == key; });
}

}  // namespace cohort::p2p::loopback

#endif  // COHORT_HAVE_SWARM

// Who is in the swarm: each peer's record (address, global step, samples accumulated toward the next
// step, samples/s) in OpenDHT, the Kademlia DHT that Hivemind's peers use too. There is no master: a
// peer bootstraps from any live peer in swarm.initial_peers, and the records of the run live in the DHT
// (under a key made from the run's public key), so the first peer may leave and the rest go on.
//
//   swarm::Directory directory(identity, run_key, "10.0.0.2:7000", {"10.0.0.3:7000"}, options, log);
//   directory.announce({.address = transport.address(), .step = 12, .samples = 384});
//   for (const auto& peer : directory.peers()) ...   // live peers other than this one, newest record each
//
// Every record is sealed with its peer's token (swarm/Auth.h): a record from a peer without a valid,
// unexpired token of this run is refused and named in the log. A record expires `record_ttl_s` after it
// was written; a peer republishes its own every `announce_s`, so a dead peer drops out within the TTL.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "cohort/swarm/Auth.h"
#include "cohort/swarm/Transport.h"

namespace dht {
class DhtRunner;
}

namespace cohort::swarm {

struct PeerRecord {
  PeerKey key{};
  std::string address;       // swarm.listen: TCP for frames, UDP for the DHT, the same HOST:PORT
  int64_t step = 0;          // the swarm's global step this peer is on
  int64_t samples = 0;       // samples accumulated toward that step
  double samples_per_s = 0;  // its recent training speed
  bool ready = false;        // it wants to average for `step` now
  bool leaving = false;      // it is leaving (Ctrl-C): leave it out of groups
  double written_unix = 0;   // when the record was written (its expiry counts from here)
};

struct DirectoryOptions {
  double announce_s = 1.0;    // a peer republishes its record this often
  double refresh_s = 0.1;     // and reads the others' this often
  double record_ttl_s = 4.0;  // a record older than this is a dead peer's
};

class Directory {
 public:
  Directory(PeerIdentity me, PeerKey run_public_key, const std::string& listen,
            const std::vector<std::string>& initial_peers, DirectoryOptions options,
            std::function<void(const std::string&)> log);
  ~Directory();
  Directory(const Directory&) = delete;
  Directory& operator=(const Directory&) = delete;

  // This peer's record, published now (at most every refresh_s) and again every announce_s.
  void announce(PeerRecord mine);
  // The live peers other than this one, as of the last read; newest record of each.
  std::vector<PeerRecord> peers() const;
  // Waits until the next read of the DHT completes (or `timeout_s`); returns the live peers then.
  std::vector<PeerRecord> fresh_peers(double timeout_s);
  // Distinct peers ever seen alive (for the run's summary).
  int64_t peers_seen() const;

 private:
  void run();
  void publish(const PeerRecord& record);
  void read();

  PeerIdentity me_;
  PeerKey run_public_key_;
  DirectoryOptions options_;
  std::function<void(const std::string&)> log_;
  std::unique_ptr<dht::DhtRunner> dht_;
  std::string key_;  // the DHT key of this run's records

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  PeerRecord mine_;
  bool mine_dirty_ = false;
  std::map<PeerKey, std::pair<uint64_t, PeerRecord>> records_;  // newest (counter, record) per peer
  std::set<PeerKey> seen_;
  std::set<std::string> refused_logged_;  // each refusal logged once, not at every read
  uint64_t reads_ = 0;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace cohort::swarm

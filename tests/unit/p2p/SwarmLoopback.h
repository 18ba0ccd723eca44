// Swarm peers on loopback for the p2p unit tests: real sockets and a real OpenDHT, peers as threads, each
// on its own 127.0.0.x address (OpenDHT rate-limits per address, FACTS.md). Shared by test_averager.cpp
// and test_directory.cpp; each test there takes hosts no other test of the two uses.
//
//   Logs logs;
//   Peer a(run, 11, "", logs), b(run, 12, a.transport.address(), logs);
#pragma once

#include <algorithm>
#include <chrono>
#include <ctime>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <unistd.h>

#include "cohort/p2p/Auth.h"
#include "cohort/p2p/Averager.h"
#include "cohort/p2p/Directory.h"
#include "cohort/p2p/Transport.h"

namespace cohort::p2p::loopback {

using namespace std::chrono_literals;

inline int64_t now_unix() { return static_cast<int64_t>(std::time(nullptr)); }

struct Logs {
  std::mutex mutex;
  std::vector<std::string> lines;
  std::function<void(const std::string&)> sink() {
    return [this](const std::string& line) {
      std::lock_guard lock(mutex);
      lines.push_back(line);
    };
  }
  bool contains(const std::string& text) {
    std::lock_guard lock(mutex);
    for (const auto& l : lines)
      if (l.find(text) != std::string::npos) return true;
    return false;
  }
};

// The rest needs OpenDHT (COHORT_HAVE_SWARM; Debian 13 has no OpenDHT package).
#if COHORT_HAVE_SWARM

// A port per test run, so that parallel ctest processes do not collide.
inline uint16_t base_port() {
  static const uint16_t port = static_cast<uint16_t>(20000 + (::getpid() % 2000) * 10);
  return port;
}

// One peer: identity, transport and directory, at 127.0.0.<host>.
struct Peer {
  Peer(const p2p::RunKey& run, int host, const std::string& bootstrap, Logs& logs, p2p::DirectoryOptions d = {})
      : Peer(run, p2p::issue_token(run, 1h, now_unix()), host, bootstrap, logs, d) {}
  // A peer that writes under `run`'s DHT key with `identity` (an intruder's, in one test).
  Peer(const p2p::RunKey& run, p2p::PeerIdentity id, int host, const std::string& bootstrap, Logs& logs,
       p2p::DirectoryOptions d)
      : identity(std::move(id)),
        transport(identity, run.public_key,
                  "127.0.0." + std::to_string(host) + ":" + std::to_string(base_port() + host), logs.sink()),
        directory(identity, run.public_key, transport.address(),
                  bootstrap.empty() ? std::vector<std::string>{} : std::vector<std::string>{bootstrap}, d, logs.sink(),
                  &transport) {}
  p2p::PeerIdentity identity;
  p2p::Transport transport;
  p2p::Directory directory;
  p2p::Member member() const { return {transport.key(), transport.address()}; }
};

// Records that change only when announced: no heartbeat for 30 s and none expiring, the DHT read every
// 0.2 s (peers find each other there). A peer's one put waits for its first DHT contact, which under load
// can come after `meet` and carry a later record; a peer whose changes a test watches is kept out of the
// DHT with never_in_the_dht.
inline p2p::DirectoryOptions no_heartbeat_within_a_test() {
  p2p::DirectoryOptions d;
  d.announce_s = 30;
  d.record_ttl_s = 60;
  d.dht_put_s = 100;
  d.dht_read_s = 0.2;
  d.dht_read_known_s = 0.2;
  return d;
}

// The same, for a peer whose record never goes into the DHT (a put is due dht_put_s after the last, and
// the first is counted from an hour before the start): others meet it by its knock or by knocking on it.
// Seen in CI without it: a peer read the DHT after meeting and got the other's readiness from the put
// that came late.
inline p2p::DirectoryOptions never_in_the_dht() {
  auto d = no_heartbeat_within_a_test();
  d.dht_put_s = 1e9;
  return d;
}

// Announces each peer's record, again every 100 ms (with no heartbeat a peer met by a knock would not
// hear back), until each sees all the others by a record sealed after the last announcement (true) or
// 10 s pass. Each peer's last announcement has gone out to everyone then: a change a test announces next
// with Reach::kGroup goes to its group only, not with a send to everyone still pending.
inline bool meet(const std::vector<std::pair<Peer*, p2p::PeerRecord>>& peers) {
  const auto deadline = p2p::Clock::now() + 10s;
  double announced = std::numeric_limits<double>::infinity();
  for (;;) {
    bool all = true;
    for (const auto& [peer, record] : peers) {
      const auto seen = peer->directory.peers();
      all = all && seen.size() + 1 == peers.size() &&
            std::all_of(seen.begin(), seen.end(), [&](const auto& r) { return r.written_unix >= announced; });
    }
    if (all || p2p::Clock::now() > deadline) return all;
    announced = p2p::detail::unix_now();
    for (const auto& [peer, record] : peers) peer->directory.announce(record);
    std::this_thread::sleep_for(100ms);
  }
}

// A group in the order every member must hold it in (the averager's test peers agree on it this way).
inline std::vector<p2p::Member> sorted(std::vector<p2p::Member> group) {
  std::sort(group.begin(), group.end(), [](const p2p::Member& a, const p2p::Member& b) { return a.key < b.key; });
  return group;
}

// One all_reduce of `round` by every peer at once, peer i with `options_of(i)` and values[i] weighted
// i + 1. Returns the outcomes and what `count(i)` grew by in the round, read 300 ms after the last one
// ended: the transport counts a frame once its I/O thread has sent it, which can be after the round.
inline std::pair<std::vector<p2p::RoundOutcome>, std::vector<int64_t>> all_reduce_together(
    std::vector<std::unique_ptr<Peer>>& peers, const std::vector<p2p::Member>& group,
    const std::vector<at::Tensor>& values, uint64_t round, const std::function<int64_t(int)>& count,
    const std::function<p2p::AveragingOptions(int)>& options_of) {
  const int n = static_cast<int>(peers.size());
  std::vector<p2p::RoundOutcome> out(peers.size());
  std::vector<int64_t> grew(peers.size());
  for (int i = 0; i < n; ++i) grew[static_cast<size_t>(i)] = -count(i);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i)
    threads.emplace_back([&, i] {
      const auto k = static_cast<size_t>(i);
      p2p::Averager averager(peers[k]->transport, peers[k]->directory, options_of(i));
      out[k] = averager.all_reduce(round, group, values[k], i + 1);
    });
  for (auto& t : threads) t.join();
  std::this_thread::sleep_for(300ms);
  for (int i = 0; i < n; ++i) grew[static_cast<size_t>(i)] += count(i);
  return {out, grew};
}

#endif  // COHORT_HAVE_SWARM

}  // namespace cohort::p2p::loopback

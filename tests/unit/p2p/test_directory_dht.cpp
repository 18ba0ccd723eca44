// The swarm's directory and the DHT, with real sockets and a real OpenDHT on loopback (SwarmLoopback.h,
// DhtLoopback.h): where the run's records go in the DHT (Note [The run's records in sixteen buckets] in
// p2p/DirectoryDht.cpp), what a leaving peer leaves there, and how often a peer puts. Which records a read
// asks for and when: test_directory_dht_reads.cpp. How peers find each other and whom a change reaches:
// test_directory.cpp.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "cohort/p2p/Directory.h"
#include "unit/p2p/DhtLoopback.h"
#include "unit/p2p/SwarmLoopback.h"

namespace cohort::p2p {
namespace {

using namespace loopback;

#if COHORT_HAVE_SWARM

// Note [The run's records in sixteen buckets]: two peers in different buckets put their records, and an
// observer that knows nobody (as `cohort swarm status`, with no transport) finds both in the DHT alone,
// since it reads every bucket; every DHT node counts what it sends.
TEST(SwarmDirectory, RecordsSpreadOverBucketsAreAllFoundByAPeerThatKnowsNobody) {
  Logs logs;
  const auto run = p2p::generate_run_key();
  const auto d = puts_often();
  Peer a(run, 190, "", logs, d);
  auto id = p2p::issue_token(run, 1h, now_unix());
  while (p2p::detail::dht_bucket(id.token.peer_public_key) == p2p::detail::dht_bucket(a.transport.key()))
    id = p2p::issue_token(run, 1h, now_unix());
  Peer b(run, id, 191, a.transport.address(), logs, d);
  a.directory.announce({{}, a.transport.address(), 3, 0, 1.0});
  b.directory.announce({{}, b.transport.address(), 4, 0, 1.0});
  p2p::Directory observer(p2p::issue_token(run, 1h, now_unix()), run.public_key,
                          "127.0.0.192:" + std::to_string(base_port() + 192), {a.transport.address()}, d, logs.sink());
  const auto deadline = p2p::Clock::now() + 15s;
  // A record goes into the DHT when it is sealed and the DHT has a contact: announced again until then.
  for (int64_t samples = 1; p2p::Clock::now() < deadline && observer.peers().size() < 2; ++samples) {
    a.directory.announce({{}, a.transport.address(), 3, samples, 1.0});
    b.directory.announce({{}, b.transport.address(), 4, samples, 1.0});
    std::this_thread::sleep_for(100ms);
  }
  const auto seen = observer.peers();
  ASSERT_EQ(seen.size(), 2u);
  for (const auto& p : seen) EXPECT_EQ(p.step, p.key == a.transport.key() ? 3 : 4);
  EXPECT_GT(a.directory.dht_bytes_sent(), 0);
  EXPECT_GT(observer.dht_bytes_sent(), 0);
}

// A peer that knows others reads one bucket of records at a time (Note [The run's records in sixteen
// buckets]): a's directory puts its record named by its bucket, and a read of the run's key that asks for
// that bucket finds it, one that asks for another bucket finds nothing. The reader is a bare OpenDHT node
// that knows a alone (on loopback OpenDHT addresses a third node wrongly: docs/scaling.md).
TEST(SwarmDirectory, ARecordIsReadByItsBucketAndNotByAnother) {
  Logs logs;
  const auto run = p2p::generate_run_key();
  const auto d = puts_often();
  Peer a(run, 193, "", logs, d);
  dht::DhtRunner reader;
  start_bare_dht_node(reader, 194, 193);
  const auto key = run_dht_key(run);
  const int bucket = p2p::detail::dht_bucket(a.transport.key());
  const auto count = [&](int b) {  // values a read of bucket b returns
    std::promise<size_t> got;
    auto n = std::make_shared<size_t>(0);
    reader.get(
        key,
        [n](const std::vector<std::shared_ptr<dht::Value>>& values) {
          *n += values.size();
          return true;
        },
        [n, &got](bool) { got.set_value(*n); }, {}, dht::Where{}.userType(p2p::detail::dht_bucket_name(b)));
    return got.get_future().get();
  };
  size_t mine = 0;
  const auto deadline = p2p::Clock::now() + 20s;
  // A record goes into the DHT when it is sealed and the DHT has a contact: announced again until then.
  for (int64_t samples = 1; p2p::Clock::now() < deadline && (mine = count(bucket)) == 0; ++samples) {
    a.directory.announce({{}, a.transport.address(), 7, samples, 1.0});
    std::this_thread::sleep_for(200ms);
  }
  EXPECT_EQ(mine, 1u);
  EXPECT_EQ(count((bucket + 1) % p2p::Directory::kDhtBuckets), 0u);
  reader.join();
}

// A peer of an earlier release puts its record with no bucket (no user type) under the run's key, as
// every record was before Note [The run's records in sixteen buckets]: an observer that knows nobody
// still reads it. The old peer here is a bare OpenDHT node putting such a record.
TEST(SwarmDirectory, ARecordOfAnEarlierReleaseWithNoBucketIsReadByAPeerThatKnowsNobody) {
  Logs logs;
  const auto run = p2p::generate_run_key();
  Peer a(run, 196, "", logs, no_heartbeat_within_a_test());
  dht::DhtRunner bare;
  start_bare_dht_node(bare, 197, 196);
  const auto old = put_old_record(bare, run, 197, 197);
  p2p::Directory observer(p2p::issue_token(run, 1h, now_unix()), run.public_key,
                          "127.0.0.198:" + std::to_string(base_port() + 198), {a.transport.address()},
                          no_heartbeat_within_a_test(), logs.sink());
  const auto deadline = p2p::Clock::now() + 15s;
  while (p2p::Clock::now() < deadline && !knows(observer, old)) std::this_thread::sleep_for(50ms);
  EXPECT_TRUE(knows(observer, old));
  bare.join();
}

// SwarmPeer's destructor: once leave() returns, a's record saying it leaves is in the DHT, and c, which knew
// a, drops it (the frame that tells it may arrive after the put's answer).
TEST(SwarmDirectory, WhenLeaveReturnsTheRecordSayingSoIsInTheDhtAndWithTheKnownPeers) {
  Logs logs;
  const auto run = p2p::generate_run_key();
  const auto d = puts_often();
  MetPair pair(run, 227, logs, d);
  ASSERT_TRUE(pair.met);
  auto &a = pair.a, &c = pair.c;
  auto& reader = pair.bare;
  const auto asked = p2p::Clock::now();
  a.directory.leave({{}, a.transport.address(), 1, 0, 1.0}, 30);
  EXPECT_LT(std::chrono::duration<double>(p2p::Clock::now() - asked).count(), 10.0);  // not its 30 s timeout
  const uint64_t id = p2p::detail::dht_value_id(a.transport.key());
  bool leaving = false;  // a node holds a's record saying it leaves
  for (const auto& data : dht_values(reader, run, id)) {
    const auto opened = p2p::open(data.data(), data.size(), run.public_key, now_unix());
    const auto* o = std::get_if<p2p::Opened>(&opened);
    const auto record = o ? p2p::detail::decode_record(o->payload, o->token.peer_public_key) : std::nullopt;
    leaving = leaving || (record && record->leaving);
  }
  EXPECT_TRUE(leaving);
  const auto deadline = p2p::Clock::now() + 5s;
  while (p2p::Clock::now() < deadline && knows(c.directory, a.transport.key())) std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(knows(c.directory, a.transport.key()));
  // A peer with no DHT contact (it knows no other node) returns at once.
  Peer alone(run, 232, "", logs, d);
  alone.directory.announce({{}, alone.transport.address(), 1, 0, 1.0});
  const auto alone_asked = p2p::Clock::now();
  alone.directory.leave({{}, alone.transport.address(), 1, 0, 1.0}, 30);
  EXPECT_LT(std::chrono::duration<double>(p2p::Clock::now() - alone_asked).count(), 10.0);
}

// Note [A peer that knows others puts seldom]: a and c know each other and put every 0.5 s (dht_put_s)
// while they know nobody; a's record changes every 100 ms, and a bare node reads a's bucket every 200 ms
// for 4 s. Knowing c, a puts every 5 s (kDhtPutKnownPuts dht_put_s): the reader sees at most one new
// version of a's record (three, if the nodes it reads still differ), where a put every 0.5 s showed eight.
TEST(SwarmDirectory, APeerThatKnowsOthersPutsItsRecordSeldom) {
  Logs logs;
  const auto run = p2p::generate_run_key();
  const auto d = puts_often();
  MetPair pair(run, 218, logs, d);
  ASSERT_TRUE(pair.met);
  auto& a = pair.a;
  auto& reader = pair.bare;
  const auto bucket = p2p::detail::dht_bucket_name(p2p::detail::dht_bucket(a.transport.key()));
  const uint64_t id = p2p::detail::dht_value_id(a.transport.key());
  const auto read = [&] {  // a's record as the DHT holds it, empty when it holds none
    const auto copies = dht_values(reader, run, id, dht::Where{}.userType(bucket));
    return copies.empty() ? std::vector<uint8_t>{} : copies.back();
  };
  const auto put_once = p2p::Clock::now() + 20s;
  while (p2p::Clock::now() < put_once && read().empty()) std::this_thread::sleep_for(100ms);
  ASSERT_FALSE(read().empty());
  std::set<std::vector<uint8_t>> versions;
  int64_t samples = 1;
  for (const auto until = p2p::Clock::now() + 4s; p2p::Clock::now() < until;) {
    for (int i = 0; i < 2; ++i, ++samples) {
      a.directory.announce({{}, a.transport.address(), 1, samples, 1.0});
      std::this_thread::sleep_for(100ms);
    }
    versions.insert(read());
  }
  EXPECT_LE(versions.size(), 3u);
}

#endif  // COHORT_HAVE_SWARM

}  // namespace
}  // namespace cohort::p2p

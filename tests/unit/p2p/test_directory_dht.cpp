// The swarm's directory and the DHT, with real sockets and a real OpenDHT on loopback (SwarmLoopback.h):
// where the run's records go in the DHT and which of them a read asks for (Note [The run's records in
// sixteen buckets] in p2p/Directory.cpp). How peers find each other and whom a change reaches:
// test_directory.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <future>
#include <memory>
#include <set>
#include <thread>

#include "cohort/p2p/Directory.h"
#if COHORT_HAVE_SWARM
#include <opendht/dhtrunner.h>
#endif
#include "unit/p2p/SwarmLoopback.h"

namespace cohort::p2p {
namespace {

using namespace loopback;

#if COHORT_HAVE_SWARM

// Records that change only when announced (no_heartbeat_within_a_test), put into the DHT every 0.5 s.
p2p::DirectoryOptions puts_often() {
  auto d = no_heartbeat_within_a_test();
  d.dht_put_s = 0.5;
  return d;
}

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

// A bare OpenDHT node at 127.0.0.<host> that knows the one at 127.0.0.<bootstrap>: a reader, or a peer of
// an earlier release, beside the directories.
void start_bare_dht_node(dht::DhtRunner& node, int host, int bootstrap) {
  dht::DhtRunner::Config config;
  config.threaded = true;
  config.bind4 = dht::SockAddr::resolve("127.0.0." + std::to_string(host), std::to_string(base_port() + host)).front();
  node.run(config, {});
  node.bootstrap("127.0.0." + std::to_string(bootstrap), std::to_string(base_port() + bootstrap));
}

// The DHT key of a run's records.
dht::InfoHash run_dht_key(const p2p::RunKey& run) {
  return dht::InfoHash::get(p2p::detail::dht_run_key(run.public_key));
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
  const auto old = p2p::issue_token(run, 1h, now_unix());
  const std::string old_address = "127.0.0.197:" + std::to_string(base_port() + 197);
  p2p::PeerRecord record{{}, old_address, 9, 0, 1.0};
  record.key = old.token.peer_public_key;
  record.written_unix = now_unix();
  const auto sealed = p2p::seal(old, p2p::PeerKey{}, p2p::next_counter(), p2p::detail::encode_record(record));
  dht::DhtRunner bare;
  start_bare_dht_node(bare, 197, 196);
  auto value = std::make_shared<dht::Value>(sealed.data(), sealed.size());
  value->id = 197;
  value->type = p2p::detail::kDhtRecordType;  // as every release has it
  bare.put(run_dht_key(run), value);
  p2p::Directory observer(p2p::issue_token(run, 1h, now_unix()), run.public_key,
                          "127.0.0.198:" + std::to_string(base_port() + 198), {a.transport.address()},
                          no_heartbeat_within_a_test(), logs.sink());
  const auto sees_old = [&] {
    const auto peers = observer.peers();
    return std::any_of(peers.begin(), peers.end(),
                       [&](const p2p::PeerRecord& p) { return p.key == old.token.peer_public_key && p.step == 9; });
  };
  const auto deadline = p2p::Clock::now() + 15s;
  while (p2p::Clock::now() < deadline && !sees_old()) std::this_thread::sleep_for(50ms);
  EXPECT_TRUE(sees_old());
  bare.join();
}

// Note [A waiting peer reads every record once in six reads]: c knows a, and asks fresh_peers for every
// record again and again, as a peer waiting for the swarm does. A record only a read of every record finds
// (an earlier release's, with no bucket), put after the read of every record that c's first call made, is
// found, and not before six reads' time has passed since that call: the reads in between were of one
// bucket each.
TEST(SwarmDirectory, AWaitingPeerReadsEveryRecordOnceInSixReads) {
  Logs logs;
  const auto run = p2p::generate_run_key();
  auto d = no_heartbeat_within_a_test();
  d.dht_read_known_s = 0.5;
  const auto gap = std::chrono::duration<double>(p2p::Directory::kFullReadGapReads * d.dht_read_known_s);
  Peer a(run, 210, "", logs, d);
  Peer c(run, 211, a.transport.address(), logs, d);
  ASSERT_TRUE(meet({{&a, {{}, a.transport.address(), 1, 0, 1.0}}, {&c, {{}, c.transport.address(), 1, 0, 1.0}}}));
  dht::DhtRunner bare;
  start_bare_dht_node(bare, 212, 210);
  // c read every record last while it knew nobody: the first read fresh_peers asks for once the gap has
  // passed reads them all.
  std::this_thread::sleep_for(gap + 500ms);
  const auto asked = p2p::Clock::now();
  c.directory.fresh_peers(10);
  const auto old = p2p::issue_token(run, 1h, now_unix());
  p2p::PeerRecord record{{}, "127.0.0.213:" + std::to_string(base_port() + 213), 9, 0, 1.0};
  record.key = old.token.peer_public_key;
  record.written_unix = now_unix();
  const auto sealed = p2p::seal(old, p2p::PeerKey{}, p2p::next_counter(), p2p::detail::encode_record(record));
  auto value = std::make_shared<dht::Value>(sealed.data(), sealed.size());
  value->id = 213;
  value->type = p2p::detail::kDhtRecordType;
  bare.put(run_dht_key(run), value);
  const auto sees_old = [&] {
    const auto peers = c.directory.peers();
    return std::any_of(peers.begin(), peers.end(), [&](const p2p::PeerRecord& p) { return p.key == record.key; });
  };
  while (p2p::Clock::now() < asked + 20s && !sees_old()) c.directory.fresh_peers(0.3);
  const auto seen_at = p2p::Clock::now();
  ASSERT_TRUE(sees_old());
  EXPECT_GE(std::chrono::duration<double>(seen_at - asked).count(), gap.count());
  bare.join();
}

// Note [A read of many records delays the next]: c knows a, and a bare node puts 30 records of the run
// that only a read of every record finds (an earlier release's, with no bucket). Once c's read of every
// record has brought them (32 records: sixteen reads' worth, at most six), c makes no read for about six
// reads' time (3 s), where it read every 0.5 s (dht_read_known_s), and no longer; then it reads every 0.5
// s again: its reads of one bucket bring one record at most.
TEST(SwarmDirectory, AReadOfManyRecordsDelaysTheNext) {
  Logs logs;
  const auto run = p2p::generate_run_key();
  auto d = no_heartbeat_within_a_test();
  d.dht_read_known_s = 0.5;
  Peer a(run, 214, "", logs, d);
  Peer c(run, 215, a.transport.address(), logs, d);
  ASSERT_TRUE(meet({{&a, {{}, a.transport.address(), 1, 0, 1.0}}, {&c, {{}, c.transport.address(), 1, 0, 1.0}}}));
  dht::DhtRunner bare;
  start_bare_dht_node(bare, 216, 214);
  std::set<p2p::PeerKey> old;
  for (uint64_t i = 1; i <= 30; ++i) {
    const auto id = p2p::issue_token(run, 1h, now_unix());
    // At the bare node's address: c makes a DHT contact of every peer it sees.
    p2p::PeerRecord record{{}, "127.0.0.216:" + std::to_string(base_port() + 216), 9, 0, 1.0};
    record.key = id.token.peer_public_key;
    record.written_unix = now_unix();  // live for the whole test (record_ttl_s is 60)
    const auto sealed = p2p::seal(id, p2p::PeerKey{}, p2p::next_counter(), p2p::detail::encode_record(record));
    auto value = std::make_shared<dht::Value>(sealed.data(), sealed.size());
    value->id = 1000 + i;
    value->type = p2p::detail::kDhtRecordType;
    bare.put(run_dht_key(run), value);
    old.insert(record.key);
  }
  const auto sees_all = [&] {
    size_t n = 0;
    for (const auto& p : c.directory.peers()) n += old.count(p.key);
    return n == old.size();
  };
  const auto deadline = p2p::Clock::now() + 40s;
  while (p2p::Clock::now() < deadline && !sees_all()) c.directory.fresh_peers(0.3);
  ASSERT_TRUE(sees_all());
  // The waits between reads completing, over 8 s from the read that brought them all.
  std::vector<double> waits;
  auto last = p2p::Clock::now();
  const auto until = last + 8s;
  for (auto seen = c.directory.dht_reads(); p2p::Clock::now() < until;) {
    std::this_thread::sleep_for(10ms);
    if (c.directory.dht_reads() == seen) continue;
    seen = c.directory.dht_reads();
    waits.push_back(std::chrono::duration<double>(p2p::Clock::now() - last).count());
    last = p2p::Clock::now();
  }
  ASSERT_FALSE(waits.empty());
  const auto longest = std::max_element(waits.begin(), waits.end());
  EXPECT_GE(*longest, 2.2);  // six reads' time from the read's start, less its own time
  EXPECT_LE(*longest, 6.0);  // not sixteen (8 s)
  // Then about every 0.5 s again (a read OpenDHT retries takes a second more).
  ASSERT_GE(waits.end() - longest - 1, 3);
  double after = 0;
  for (auto w = longest + 1; w != waits.end(); ++w) after += *w;
  EXPECT_LE(after / static_cast<double>(waits.end() - longest - 1), 1.2);
  bare.join();
}

// Note [A peer that knows others puts seldom]: a and c know each other and put every 0.5 s (dht_put_s)
// while they know nobody; a's record changes every 100 ms, and a bare node reads a's bucket every 200 ms
// for 4 s. Knowing c, a puts every 5 s (kDhtPutKnownPuts dht_put_s): the reader sees at most one new
// version of a's record (three, if the nodes it reads still differ), where a put every 0.5 s showed eight.
TEST(SwarmDirectory, APeerThatKnowsOthersPutsItsRecordSeldom) {
  Logs logs;
  const auto run = p2p::generate_run_key();
  const auto d = puts_often();
  Peer a(run, 218, "", logs, d);
  Peer c(run, 219, a.transport.address(), logs, d);
  ASSERT_TRUE(meet({{&a, {{}, a.transport.address(), 1, 0, 1.0}}, {&c, {{}, c.transport.address(), 1, 0, 1.0}}}));
  dht::DhtRunner reader;
  start_bare_dht_node(reader, 220, 218);
  const auto bucket = p2p::detail::dht_bucket_name(p2p::detail::dht_bucket(a.transport.key()));
  const uint64_t id = p2p::detail::dht_value_id(a.transport.key());
  const auto read = [&] {  // a's record as the DHT holds it, empty when it holds none
    std::promise<std::vector<uint8_t>> got;
    auto data = std::make_shared<std::vector<uint8_t>>();
    reader.get(
        run_dht_key(run),
        [data, id](const std::vector<std::shared_ptr<dht::Value>>& values) {
          for (const auto& value : values)
            if (value && value->id == id) *data = value->data;
          return true;
        },
        [data, &got](bool) { got.set_value(*data); }, {}, dht::Where{}.userType(bucket));
    return got.get_future().get();
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
  reader.join();
}

#endif  // COHORT_HAVE_SWARM

}  // namespace
}  // namespace cohort::p2p

// The swarm's directory and the DHT, with real sockets and a real OpenDHT on loopback (SwarmLoopback.h):
// where the run's records go in the DHT and which of them a read asks for (Note [The run's records in
// sixteen buckets] in p2p/DirectoryDht.cpp). How peers find each other and whom a change reaches:
// test_directory.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <future>
#include <memory>
#include <optional>
#include <set>
#include <thread>
#include <variant>

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

// A bare OpenDHT node at 127.0.0.<host> that knows the one at 127.0.0.<bootstrap> (none: `host` itself): a
// reader, a peer of an earlier release, or a DHT that no peer listens at, beside the directories.
void start_bare_dht_node(dht::DhtRunner& node, int host, int bootstrap) {
  dht::DhtRunner::Config config;
  config.threaded = true;
  config.bind4 = dht::SockAddr::resolve("127.0.0." + std::to_string(host), std::to_string(base_port() + host)).front();
  node.run(config, {});
  if (bootstrap != host)
    node.bootstrap("127.0.0." + std::to_string(bootstrap), std::to_string(base_port() + bootstrap));
}

// The DHT key of a run's records.
dht::InfoHash run_dht_key(const p2p::RunKey& run) {
  return dht::InfoHash::get(p2p::detail::dht_run_key(run.public_key));
}

// A live record of the run for `id`, with the address 127.0.0.<host> (a peer makes a DHT contact of every peer
// it sees: give the bare node's, or one where nothing listens), put by the bare node `bare` under `value_id`:
// named by `bucket`, or by none as a peer of an earlier release puts it (only a read of every record finds
// that). Returns once the put completed.
void put_record(dht::DhtRunner& bare, const p2p::RunKey& run, const p2p::PeerIdentity& id, int host, uint64_t value_id,
                int bucket = -1) {
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
p2p::PeerKey put_old_record(dht::DhtRunner& bare, const p2p::RunKey& run, int host, uint64_t value_id) {
  const auto old = p2p::issue_token(run, 1h, now_unix());
  put_record(bare, run, old, host, value_id);
  return old.token.peer_public_key;
}

// The values of DHT value id `id` under the run's key that a read from `node` brings (of the bucket `where`
// names, if any): each node's copy.
std::vector<std::vector<uint8_t>> dht_values(dht::DhtRunner& node, const p2p::RunKey& run, uint64_t id,
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

bool knows(const p2p::Directory& directory, const p2p::PeerKey& key) {
  const auto peers = directory.peers();
  return std::any_of(peers.begin(), peers.end(), [&](const p2p::PeerRecord& p) { return p.key == key; });
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

// Notes [A waiting peer reads every record once in six reads], [A newcomer reads a bucket at a time]: c
// knows a, and asks fresh_peers for every record again and again, as a peer waiting for the swarm does. A
// record only a read of every record finds (an earlier release's, with no bucket), put as soon as they
// met, is found, but not before six reads' time has passed since c started: its start counts as a read of
// every record. A second one, put once the first was found, is found six reads' time after that read.
TEST(SwarmDirectory, AWaitingPeerReadsEveryRecordOnceInSixReads) {
  Logs logs;
  const auto run = p2p::generate_run_key();
  auto d = no_heartbeat_within_a_test();
  d.dht_read_known_s = 0.5;
  const double gap = p2p::Directory::kFullReadGapReads * d.dht_read_known_s;
  const auto started = p2p::Clock::now();
  MetPair pair(run, 210, logs, d);
  ASSERT_TRUE(pair.met);
  auto& c = pair.c;
  auto& bare = pair.bare;
  const auto wait_for = [&](const p2p::PeerKey& key) {  // seconds from now until c sees `key`
    const auto from = p2p::Clock::now();
    while (p2p::Clock::now() < from + 20s && !knows(c.directory, key)) c.directory.fresh_peers(0.3);
    return knows(c.directory, key) ? std::chrono::duration<double>(p2p::Clock::now() - from).count() : -1.0;
  };
  const auto first = put_old_record(bare, run, 213, 212);
  ASSERT_GE(wait_for(first), 0);
  const auto found_first = p2p::Clock::now();
  EXPECT_GE(std::chrono::duration<double>(found_first - started).count(), gap);
  const auto second = put_old_record(bare, run, 213, 213);
  ASSERT_GE(wait_for(second), 0);
  // The read that found the first completed at most one fresh_peers call (0.3 s) before it was seen.
  EXPECT_GE(std::chrono::duration<double>(p2p::Clock::now() - found_first).count(), gap - 0.5);
}

// Note [A newcomer reads a bucket at a time]: a caller of fresh_peers asks for a read of every record only
// while it waits. c knows a, and six reads' time after c started, one fresh_peers call times out before the
// next read is due (every 2 s here); then a record that only a read of every record finds (an earlier
// release's) is put, and nobody asks: c's reads for the next 6 s are of one bucket each, and none finds it.
// (A wish that outlived its caller made the next read one of every record.)
TEST(SwarmDirectory, AWishForEveryRecordLapsesWithItsCaller) {
  Logs logs;
  const auto run = p2p::generate_run_key();
  auto d = no_heartbeat_within_a_test();
  d.dht_read_known_s = 0.5;
  MetPair pair(run, 233, logs, d);
  ASSERT_TRUE(pair.met);
  auto& c = pair.c;
  const auto gap = std::chrono::duration<double>(p2p::Directory::kFullReadGapReads * d.dht_read_known_s);
  std::this_thread::sleep_for(gap + 500ms);  // a read of every record is due from here on
  const auto reads = c.directory.dht_reads();
  c.directory.fresh_peers(0.001);
  const auto old = put_old_record(pair.bare, run, 235, 235);
  const auto until = p2p::Clock::now() + 6s;
  while (p2p::Clock::now() < until && !knows(c.directory, old)) std::this_thread::sleep_for(50ms);
  EXPECT_GT(c.directory.dht_reads(), reads + 2);  // it read, of one bucket each
  EXPECT_FALSE(knows(c.directory, old));
}

// Note [A newcomer reads a bucket at a time]: the DHT holds one record, an earlier release's (no bucket), and
// c knows nobody (its initial peer is a bare DHT node, and it puts nothing). Its reads of the sixteen buckets
// find nobody, and the read after them, of every record, finds it.
TEST(SwarmDirectory, ANewcomerWhoseBucketsHoldNobodyReadsEveryRecord) {
  Logs logs;
  const auto run = p2p::generate_run_key();
  auto d = no_heartbeat_within_a_test();
  d.dht_put_s = 1e9;
  dht::DhtRunner bare;
  start_bare_dht_node(bare, 236, 236);
  const auto old = put_old_record(bare, run, 236, 236);
  Peer c(run, 237, "127.0.0.236:" + std::to_string(base_port() + 236), logs, d);
  c.directory.announce({{}, c.transport.address(), 1, 0, 1.0});
  const auto deadline = p2p::Clock::now() + 20s;
  while (p2p::Clock::now() < deadline && !knows(c.directory, old)) std::this_thread::sleep_for(20ms);
  EXPECT_TRUE(knows(c.directory, old));
  EXPECT_GE(c.directory.dht_reads(), static_cast<uint64_t>(p2p::Directory::kDhtBuckets));
  bare.join();
}

// Note [A newcomer reads a bucket at a time]: the DHT holds 32 live records of the run, two in each bucket,
// and c knows nobody (its initial peer is a bare DHT node). Its first read brings the two of one bucket, not
// the 32; knowing them, it reads again only after dht_read_known_s (10 s here).
TEST(SwarmDirectory, ANewcomerReadsOneBucketOfManyRecords) {
  Logs logs;
  const auto run = p2p::generate_run_key();
  auto d = no_heartbeat_within_a_test();
  d.dht_read_known_s = 10;
  dht::DhtRunner bare;
  start_bare_dht_node(bare, 222, 222);
  std::vector<int> in_bucket(p2p::Directory::kDhtBuckets, 0);
  std::set<p2p::PeerKey> all;
  while (all.size() < 2 * p2p::Directory::kDhtBuckets) {
    const auto id = p2p::issue_token(run, 1h, now_unix());
    const int bucket = p2p::detail::dht_bucket(id.token.peer_public_key);
    if (in_bucket[static_cast<size_t>(bucket)] == 2) continue;
    ++in_bucket[static_cast<size_t>(bucket)];
    put_record(bare, run, id, 222, p2p::detail::dht_value_id(id.token.peer_public_key), bucket);
    all.insert(id.token.peer_public_key);
  }
  Peer c(run, 223, "127.0.0.222:" + std::to_string(base_port() + 222), logs, d);
  c.directory.announce({{}, c.transport.address(), 1, 0, 1.0});
  const auto deadline = p2p::Clock::now() + 15s;
  while (p2p::Clock::now() < deadline && c.directory.peers().empty()) std::this_thread::sleep_for(20ms);
  std::this_thread::sleep_for(1s);  // a read of every record would have come by now
  const auto seen = c.directory.peers();
  ASSERT_EQ(seen.size(), 2u);  // 32 when a newcomer read every record
  EXPECT_EQ(p2p::detail::dht_bucket(seen[0].key), p2p::detail::dht_bucket(seen[1].key));
  bare.join();
}

// Note [A newcomer reads a bucket at a time]: the DHT holds a's record alone, and three newcomers in turn
// know nobody (their initial peer is a bare DHT node, they put nothing, and a reads the DHT once, so it
// does not find them first). Reading one bucket each 2 s (dht_read_s), a newcomer would find a within 8 s
// one time in three, and within 32 s; reads that find nobody come eight times as often, so each finds a
// within a sweep of the sixteen buckets, about 5 s.
TEST(SwarmDirectory, ANewcomerSweepsTheBucketsUntilItFindsAPeer) {
  Logs logs;
  const auto run = p2p::generate_run_key();
  auto d = puts_often();
  d.dht_read_s = 2;
  dht::DhtRunner bare;
  start_bare_dht_node(bare, 224, 224);
  const std::string via_bare = "127.0.0.224:" + std::to_string(base_port() + 224);
  auto reads_once = d;
  reads_once.dht_read_s = reads_once.dht_read_known_s = 1000;
  Peer a(run, 225, via_bare, logs, reads_once);
  const uint64_t id = p2p::detail::dht_value_id(a.transport.key());
  const auto in_dht = [&] { return !dht_values(bare, run, id).empty(); };
  const auto put_by = p2p::Clock::now() + 20s;
  // A record goes into the DHT when it is sealed and the DHT has a contact: announced again until then.
  for (int64_t samples = 1; p2p::Clock::now() < put_by && !in_dht(); ++samples) {
    a.directory.announce({{}, a.transport.address(), 1, samples, 1.0});
    std::this_thread::sleep_for(100ms);
  }
  ASSERT_TRUE(in_dht());
  auto newcomer = d;
  newcomer.dht_put_s = 1e9;  // a newcomer's record stays out of the DHT: the next finds a alone
  for (const int host : {226, 230, 231}) {
    Peer c(run, host, via_bare, logs, newcomer);
    c.directory.announce({{}, c.transport.address(), 1, 0, 1.0});
    const auto from = p2p::Clock::now();
    while (p2p::Clock::now() < from + 40s && !knows(c.directory, a.transport.key())) std::this_thread::sleep_for(20ms);
    ASSERT_TRUE(knows(c.directory, a.transport.key()));
    EXPECT_LE(std::chrono::duration<double>(p2p::Clock::now() - from).count(), 8.0) << "newcomer at " << host;
  }
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

// Note [A read of many records delays the next]: c knows a, and a bare node puts 30 records of the run
// that only a read of every record finds (an earlier release's, with no bucket). Once c's read of every
// record has brought them (31 other peers' records: fifteen reads' worth, at most six), c makes no read for about six
// reads' time (3 s), where it read every 0.5 s (dht_read_known_s), and no longer; then it reads every 0.5
// s again: its reads of one bucket bring one record at most.
TEST(SwarmDirectory, AReadOfManyRecordsDelaysTheNext) {
  Logs logs;
  const auto run = p2p::generate_run_key();
  auto d = no_heartbeat_within_a_test();
  d.dht_read_known_s = 0.5;
  MetPair pair(run, 214, logs, d);
  ASSERT_TRUE(pair.met);
  auto& c = pair.c;
  auto& bare = pair.bare;
  std::set<p2p::PeerKey> old;
  for (uint64_t i = 1; i <= 30; ++i) old.insert(put_old_record(bare, run, 216, 1000 + i));
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

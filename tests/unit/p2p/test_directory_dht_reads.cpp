// Which of the run's records a peer reads from the DHT, and when, with real sockets and a real OpenDHT on
// loopback (SwarmLoopback.h, DhtLoopback.h): a newcomer's bucket at a time and its sweep (Note [A newcomer
// reads a bucket at a time] in p2p/DirectoryDht.cpp), a waiting peer's read of every record, and the delay
// after a read of many. Where the records go: test_directory_dht.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "cohort/p2p/Directory.h"
#include "unit/p2p/DhtLoopback.h"
#include "unit/p2p/SwarmLoopback.h"

namespace cohort::p2p {
namespace {

using namespace loopback;

#if COHORT_HAVE_SWARM

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

#endif  // COHORT_HAVE_SWARM

}  // namespace
}  // namespace cohort::p2p

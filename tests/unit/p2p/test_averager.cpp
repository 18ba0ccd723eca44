// The swarm's transport and averager with real sockets and a real OpenDHT on loopback (SwarmLoopback.h;
// the directory's tests are test_directory.cpp, a round's parts in pieces test_pieces.cpp, matchmaking's
// groups test_matchmaking.cpp).
#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <cstring>
#include <ctime>
#include <functional>
#include <limits>
#include <optional>
#include <thread>
#include <zmq.hpp>

#include <torch/torch.h>

#include "cohort/p2p/Averager.h"
#include "cohort/p2p/Codec.h"
#include "cohort/p2p/Directory.h"
#include "cohort/p2p/Transport.h"
#include "cohort/p2p/Wire.h"
#include "cohort/util/Error.h"
#include "unit/p2p/SwarmLoopback.h"

namespace cohort::p2p {
namespace {

using namespace loopback;

TEST(SwarmTransport, DeliversAFrameAndRefusesAnotherRunsReplayedOrMisaddressedOnes) {
  Logs logs;
  const auto run = p2p::generate_run_key();
  const auto a = p2p::issue_token(run, 1h, now_unix()), b = p2p::issue_token(run, 1h, now_unix());
  p2p::Transport ta(a, run.public_key, "127.0.0.1:0", logs.sink()), tb(b, run.public_key, "127.0.0.1:0", logs.sink());
  ta.send(tb.key(), tb.address(), {p2p::MessageKind::kPart, 3, 1}, {1, 2, 3});
  auto got = tb.receive({p2p::MessageKind::kPart, 3, 1}, p2p::Clock::now() + 5s);
  ASSERT_TRUE(got);
  EXPECT_EQ(got->sender, ta.key());
  EXPECT_EQ(got->body, (std::vector<uint8_t>{1, 2, 3}));

  // Frames sent by hand: one from a peer of another run, one replayed, one addressed to another peer.
  zmq::context_t context;
  zmq::socket_t raw(context, zmq::socket_type::dealer);
  raw.set(zmq::sockopt::linger, 0);
  raw.connect("tcp://" + tb.address());
  const auto intruder = p2p::issue_token(p2p::generate_run_key(), 1h, now_unix());
  p2p::Writer header;
  header.u8(static_cast<uint8_t>(p2p::MessageKind::kPart)).u64(4).i64(0);
  const auto payload = header.take();
  const auto foreign = p2p::seal(intruder, tb.key(), p2p::next_counter(), payload);
  const auto honest = p2p::seal(a, tb.key(), p2p::next_counter(), payload);
  const auto elsewhere = p2p::seal(a, ta.key(), p2p::next_counter(), payload);
  for (const auto* frame : {&foreign, &honest, &honest, &elsewhere}) raw.send(zmq::buffer(*frame));
  EXPECT_TRUE(tb.receive({p2p::MessageKind::kPart, 4, 0}, p2p::Clock::now() + 5s));  // the honest one, once
  EXPECT_FALSE(tb.receive({p2p::MessageKind::kPart, 4, 0}, p2p::Clock::now() + 300ms));
  EXPECT_EQ(tb.stats().frames_refused, 3);
  EXPECT_TRUE(logs.contains("signed by another run key"));
  EXPECT_TRUE(logs.contains("replayed"));
  EXPECT_TRUE(logs.contains("addressed to another peer"));
  EXPECT_TRUE(logs.contains(p2p::peer_name(intruder.token.peer_public_key)));
}

TEST(SwarmTransport, ABusyPortIsAnErrorNamingTheAddress) {
  Logs logs;
  const auto run = p2p::generate_run_key();
  p2p::Transport first(p2p::issue_token(run, 1h, now_unix()), run.public_key, "127.0.0.1:0", logs.sink());
  try {
    p2p::Transport second(p2p::issue_token(run, 1h, now_unix()), run.public_key, first.address(), logs.sink());
    FAIL() << "bound a port in use";
  } catch (const cohort::CommError& e) {
    EXPECT_NE(std::string(e.what()).find(first.address()), std::string::npos) << e.what();
  }
}

TEST(SwarmCodec, Int8KeepsEachValueWithinHalfItsBlocksStepAndSendsAQuarterOfTheBytes) {
  const auto values = torch::randn({2500}) * 3;
  const auto bytes = p2p::encode(values, p2p::Codec::kInt8);
  EXPECT_EQ(static_cast<int64_t>(bytes.size()), 2500 + 3 * 4);  // three blocks of 1024: a scale each
  const auto back = p2p::decode(bytes.data(), bytes.size(), 2500, p2p::Codec::kInt8);
  ASSERT_TRUE(back);
  for (int64_t b = 0; b < 3; ++b) {
    const auto block = values.slice(0, b * p2p::kInt8Block, std::min<int64_t>(2500, (b + 1) * p2p::kInt8Block));
    const double step = block.abs().max().item<double>() / 127;
    const auto error = (back->slice(0, b * p2p::kInt8Block, b * p2p::kInt8Block + block.numel()) - block).abs().max();
    EXPECT_LE(error.item<double>(), step / 2 + 1e-6) << "block " << b;
  }
  EXPECT_TRUE(torch::equal(p2p::roundtrip(values, p2p::Codec::kNone), values));
  EXPECT_TRUE(torch::allclose(p2p::roundtrip(values, p2p::Codec::kFp16), values, 1e-3, 1e-3));
  EXPECT_FALSE(p2p::decode(bytes.data(), bytes.size() - 1, 2500, p2p::Codec::kInt8)) << "a short body";
  auto broken = bytes;
  const float inf = std::numeric_limits<float>::infinity();
  std::memcpy(broken.data(), &inf, 4);
  EXPECT_FALSE(p2p::decode(broken.data(), broken.size(), 2500, p2p::Codec::kInt8)) << "a scale that is not finite";
  EXPECT_THROW(p2p::codec_from_name("int4", "diloco.compress"), ConfigError);
  // Appended after a header its caller wrote (a part's weight), the same bytes follow it.
  for (const auto codec : {p2p::Codec::kNone, p2p::Codec::kFp16, p2p::Codec::kInt8}) {
    std::vector<uint8_t> appended{7, 7, 7};
    p2p::encode(values, codec, appended);
    const auto alone = p2p::encode(values, codec);
    ASSERT_EQ(appended.size(), 3 + alone.size());
    EXPECT_TRUE(std::equal(alone.begin(), alone.end(), appended.begin() + 3));
    EXPECT_EQ(std::vector<uint8_t>(appended.begin(), appended.begin() + 3), (std::vector<uint8_t>{7, 7, 7}));
  }
}

// Error feedback: step after step, what arrives sums to what was sent to within one int8 step of the
// last vector's blocks, where without it the rounding errors add up.
TEST(SwarmCodec, ErrorFeedbackKeepsTheSumOfWhatArrivesOnTheSumSent) {
  torch::manual_seed(5);
  at::Tensor residual;
  auto sent = torch::zeros({4096}), arrived = torch::zeros({4096}), plain = torch::zeros({4096});
  for (int step = 0; step < 200; ++step) {
    // Each block's scale set by one value of 1, the rest small enough that int8 rounds them to 0 every
    // step: the case where losses add up (plain int8 never sends them at all).
    auto values = torch::rand({4096}) * 0.001 + 0.003;
    values.slice(0, 0, 4096, p2p::kInt8Block).fill_(1.0);
    sent += values;
    arrived += p2p::roundtrip(p2p::with_error_feedback(values, residual, p2p::Codec::kInt8), p2p::Codec::kInt8);
    plain += p2p::roundtrip(values, p2p::Codec::kInt8);
  }
  const double step = 1.0 / 127;
  EXPECT_LE((arrived - sent).abs().max().item<double>(), step);
  EXPECT_GT((plain - sent).abs().max().item<double>(), 10 * step) << "the case does not accumulate losses";
  at::Tensor untouched;
  const auto values = torch::randn({8});
  EXPECT_TRUE(torch::equal(p2p::with_error_feedback(values, untouched, p2p::Codec::kNone), values));
  EXPECT_FALSE(untouched.defined());
}

// A value past half's range goes out as half's largest, not as inf (which decode refuses, losing the part).
TEST(SwarmCodec, Fp16ClampsValuesPastHalfsRangeInsteadOfSendingInf) {
  const auto values = torch::tensor({1e6f, -1e6f, 0.5f});
  const auto back = p2p::decode(p2p::encode(values, p2p::Codec::kFp16).data(), 6, 3, p2p::Codec::kFp16);
  ASSERT_TRUE(back);
  EXPECT_TRUE(torch::equal(*back, torch::tensor({65504.0f, -65504.0f, 0.5f}))) << *back;
}

// The rest needs OpenDHT (COHORT_HAVE_SWARM; Debian 13 has no OpenDHT package).
#if COHORT_HAVE_SWARM

TEST(SwarmPlan, PartsCoverTheVectorInOrderWithSizesDifferingByAtMostOne) {
  for (int64_t numel : {0, 1, 7, 100, 1001})
    for (int64_t n : {1, 2, 3, 4, 7}) {
      int64_t next = 0, smallest = numel, largest = 0;
      for (int64_t j = 0; j < n; ++j) {
        const auto [b, e] = p2p::part_bounds(numel, n, j);
        EXPECT_EQ(b, next);
        next = e;
        smallest = std::min(smallest, e - b);
        largest = std::max(largest, e - b);
      }
      EXPECT_EQ(next, numel);
      EXPECT_LE(largest - smallest, 1);
    }
  // Parts of an int8 vector start on its blocks, so a part encodes as the whole vector's blocks do.
  for (int64_t j = 0; j < 3; ++j) EXPECT_EQ(p2p::part_bounds(5000, 3, j, 1024).first % 1024, 0);
  EXPECT_EQ(p2p::part_bounds(5000, 3, 2, 1024).second, 5000);
}

// Note [Groups on a grid]: ceil(n / M) groups, but never one that leaves a peer alone or below
// swarm.min_group_size.
TEST(SwarmPlan, ReadyPeersSplitIntoGroupsOfAtMostMUnlessOneWouldBeAloneOrTooSmall) {
  EXPECT_EQ(p2p::group_count(1, 2, 1), 1);
  EXPECT_EQ(p2p::group_count(4, 2, 1), 2);
  EXPECT_EQ(p2p::group_count(3, 2, 1), 1);  // three together, not a pair and one alone
  EXPECT_EQ(p2p::group_count(5, 2, 1), 2);  // 2 and 3
  EXPECT_EQ(p2p::group_count(8, 4, 1), 2);
  EXPECT_EQ(p2p::group_count(9, 4, 1), 3);  // 3, 3 and 3
  EXPECT_EQ(p2p::group_count(5, 4, 3), 1);  // 2 and 3 would leave a group under swarm.min_group_size
  EXPECT_EQ(p2p::group_count(64, 8, 1), 8);
}

TEST(SwarmPlan, WeightedMeanWeighsBySamplesAndLeavesALoneContributionUntouched) {
  const auto a = torch::tensor({1.0f, 2.0f}), b = torch::tensor({4.0f, 8.0f});
  EXPECT_TRUE(torch::equal(p2p::weighted_mean({a, b}, {1, 3}), torch::tensor({3.25f, 6.5f})));
  const auto odd = torch::randn({1000});
  EXPECT_TRUE(torch::equal(p2p::weighted_mean({odd}, {7}), odd));  // bit for bit
}

// Every member contributes (rank + 1) everywhere with weight (rank + 1): the weighted mean of 1, 2, 3
// with weights 1, 2, 3 is 14 / 6.
TEST(SwarmAverager, AGroupAveragesByWeightAndEveryMemberGetsTheSameBits) {
  Logs logs;
  const auto run = p2p::generate_run_key();
  std::vector<std::unique_ptr<Peer>> peers;
  for (int i = 0; i < 3; ++i)
    peers.push_back(std::make_unique<Peer>(run, 21 + i, i ? peers[0]->transport.address() : "", logs));
  const auto group = sorted({peers[0]->member(), peers[1]->member(), peers[2]->member()});
  std::vector<p2p::RoundOutcome> out(3);
  std::vector<std::thread> threads;
  for (int i = 0; i < 3; ++i)
    threads.emplace_back([&, i] {
      p2p::Averager averager(peers[i]->transport, peers[i]->directory, {1.0, 5.0, 2});
      out[i] = averager.all_reduce(7, group, torch::full({1001}, float(i + 1)), i + 1);
    });
  for (auto& t : threads) t.join();
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(out[i].parts_local, 0);
    EXPECT_EQ(out[i].contributions, 3);
    EXPECT_TRUE(out[i].problem.empty()) << out[i].problem;
    EXPECT_TRUE(torch::allclose(out[i].averaged, torch::full({1001}, 14.0f / 6)));
    EXPECT_TRUE(torch::equal(out[i].averaged, out[0].averaged));
  }
}

// swarm.compress=fp16: the same round sends about half the bytes of float32, every member still gets
// the same bits, and the mean is the float32 one to within half's rounding of the contributions and result.
TEST(SwarmAverager, Fp16RoundsSendHalfTheBytesAndEveryMemberGetsTheSameBits) {
  Logs logs;
  const auto run = p2p::generate_run_key();
  std::vector<std::unique_ptr<Peer>> peers;
  for (int i = 0; i < 3; ++i)
    peers.push_back(std::make_unique<Peer>(run, 71 + i, i ? peers[0]->transport.address() : "", logs));
  const auto group = sorted({peers[0]->member(), peers[1]->member(), peers[2]->member()});
  torch::manual_seed(3);
  const std::vector<at::Tensor> values = {torch::randn({20000}), torch::randn({20000}), torch::randn({20000})};
  const auto exact = p2p::weighted_mean(values, {1, 2, 3});
  const auto averaging_bytes = [&](int i) {
    const auto stats = peers[i]->transport.stats();
    return stats.bytes_sent - stats.record_bytes_sent;
  };
  const auto round = [&](p2p::Codec codec, uint64_t step) {
    return all_reduce_together(peers, group, values, step, averaging_bytes, [&](int) {
      p2p::AveragingOptions options{1.0, 5.0, 2};
      options.codec = codec;
      return options;
    });
  };
  const auto [plain, plain_sent] = round(p2p::Codec::kNone, 1);
  const auto [half, half_sent] = round(p2p::Codec::kFp16, 2);
  // Weights (a parameter round) go in fp32 whatever the codec (p2p/Averager.cpp): int8 here would be off by
  // up to half a 254th of each block's largest value.
  const auto [weights, weights_sent] = round(p2p::Codec::kInt8, 3 | p2p::kParametersRound);
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(half[i].problem.empty()) << half[i].problem;
    EXPECT_EQ(half[i].parts_local, 0);
    EXPECT_TRUE(torch::equal(half[i].averaged, half[0].averaged)) << "member " << i;
    EXPECT_TRUE(torch::allclose(plain[i].averaged, exact, 1e-6, 1e-6));
    EXPECT_TRUE(torch::allclose(weights[i].averaged, exact, 1e-6, 1e-6)) << "member " << i;
    // Half keeps 11 significant bits: each value within 2^-10 of itself, relative, and 1e-3 near zero.
    EXPECT_TRUE(torch::allclose(half[i].averaged, exact, 2e-3, 1e-3)) << "member " << i;
    EXPECT_FALSE(torch::equal(half[i].averaged, exact)) << "the round did not go through half";
    // Frames carry headers and authentication besides the values: about half, not exactly.
    EXPECT_LT(half_sent[i], plain_sent[i] * 0.55) << half_sent[i] << " against " << plain_sent[i];
    EXPECT_GT(half_sent[i], plain_sent[i] * 0.45) << half_sent[i] << " against " << plain_sent[i];
  }
}

// A member that never sends (dead, frozen or cut off): the others finish within the timeout with the
// weighted mean of what arrived, and keep their own values for the part the silent member reduces.
TEST(SwarmAverager, ASilentMemberIsLeftOutWithinTheTimeout) {
  Logs logs;
  const auto run = p2p::generate_run_key();
  std::vector<std::unique_ptr<Peer>> peers;
  for (int i = 0; i < 3; ++i)
    peers.push_back(std::make_unique<Peer>(run, 31 + i, i ? peers[0]->transport.address() : "", logs));
  const auto group = sorted({peers[0]->member(), peers[1]->member(), peers[2]->member()});
  const auto silent = peers[2]->transport.key();
  const double timeout = 2.0;
  std::vector<p2p::RoundOutcome> out(2);
  std::vector<double> seconds(2);
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i)
    threads.emplace_back([&, i] {
      p2p::Averager averager(peers[i]->transport, peers[i]->directory, {1.0, timeout, 2});
      const auto t0 = p2p::Clock::now();
      out[i] = averager.all_reduce(9, group, torch::full({999}, float(i + 1)), i + 1);
      seconds[i] = std::chrono::duration<double>(p2p::Clock::now() - t0).count();
    });
  for (auto& t : threads) t.join();
  const int64_t silent_index =
      std::find_if(group.begin(), group.end(), [&](const p2p::Member& m) { return m.key == silent; }) - group.begin();
  for (int i = 0; i < 2; ++i) {
    EXPECT_LE(seconds[i], timeout + 2.0);
    EXPECT_EQ(out[i].parts_local, 1);
    EXPECT_EQ(out[i].contributions, 2);
    EXPECT_NE(out[i].problem.find(p2p::peer_name(silent)), std::string::npos) << out[i].problem;
    EXPECT_TRUE(torch::isfinite(out[i].averaged).all().item<bool>());
    for (int64_t j = 0; j < 3; ++j) {
      const auto [b, e] = p2p::part_bounds(999, 3, j);
      const auto part = out[i].averaged.slice(0, b, e);
      // Weights 1 and 2 of values 1 and 2: 5 / 3. The silent member's part stays this peer's own.
      const float expected = j == silent_index ? float(i + 1) : 5.0f / 3;
      EXPECT_TRUE(torch::allclose(part, torch::full({e - b}, expected))) << "member " << i << " part " << j;
    }
  }
}

// Note [A peer in two groups declines the other]: B was sent two groups for a round, {A, B} and {B, C}.
// It averages in the first; C, left with B in the other, is told at once and does not wait out the
// timeout for B's contribution and part.
TEST(SwarmAverager, AMemberOfTwoGroupsDeclinesTheOtherAndNobodyWaitsForIt) {
  Logs logs;
  const auto run = p2p::generate_run_key();
  std::vector<std::unique_ptr<Peer>> peers;
  for (int i = 0; i < 3; ++i)
    peers.push_back(std::make_unique<Peer>(run, 66 + i, i ? peers[0]->transport.address() : "", logs));
  const auto first = sorted({peers[0]->member(), peers[1]->member()});
  const auto other = sorted({peers[1]->member(), peers[2]->member()});
  // C's group reaches B as a leader's would: the members with their addresses. Sent twice: the first,
  // taken here, shows the link is up; the second stays for B's averager to find.
  const auto send_other_group = [&] {
    p2p::Writer w;
    w.u64(other.size());
    for (const auto& m : other) w.raw(m.key.data(), m.key.size()).str(m.address);
    w.u64(0);
    peers[2]->transport.send(peers[1]->transport.key(), peers[1]->transport.address(), {p2p::MessageKind::kGroup, 5, 0},
                             w.take());
  };
  send_other_group();
  ASSERT_TRUE(peers[1]->transport.receive({p2p::MessageKind::kGroup, 5, 0}, p2p::Clock::now() + 5s).has_value());
  send_other_group();
  std::this_thread::sleep_for(200ms);
  const double timeout = 10.0;
  std::vector<p2p::RoundOutcome> out(3);
  double c_seconds = 0;
  std::vector<std::thread> threads;
  for (int i = 0; i < 3; ++i)
    threads.emplace_back([&, i] {
      p2p::Averager averager(peers[i]->transport, peers[i]->directory, {1.0, timeout, 2});
      const auto t0 = p2p::Clock::now();
      out[i] = averager.all_reduce(5, i == 2 ? other : first, torch::full({100}, float(i + 1)), 1.0);
      if (i == 2) c_seconds = std::chrono::duration<double>(p2p::Clock::now() - t0).count();
    });
  for (auto& t : threads) t.join();
  // A and B averaged with each other: (1 + 2) / 2.
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(out[i].problem.empty()) << out[i].problem;
    EXPECT_TRUE(torch::allclose(out[i].averaged, torch::full({100}, 1.5f)));
  }
  // C kept its own values, named B, and did not wait for it.
  EXPECT_LT(c_seconds, 2.0);
  EXPECT_NE(out[2].problem.find(p2p::peer_name(peers[1]->transport.key()) + " (it joined another group)"),
            std::string::npos)
      << out[2].problem;
  EXPECT_TRUE(torch::equal(out[2].averaged, torch::full({100}, 3.0f)));
}

#endif  // COHORT_HAVE_SWARM

}  // namespace
}  // namespace cohort::p2p

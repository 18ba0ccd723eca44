// Note [A part travels in pieces] (p2p/Averager.cpp): a round's parts past 1 MiB on the wire go in
// pieces, on real sockets and a real OpenDHT on loopback (SwarmLoopback.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <memory>
#include <thread>
#include <vector>

#include <torch/torch.h>

#include "cohort/p2p/Averager.h"
#include "cohort/p2p/Codec.h"
#include "cohort/p2p/Transport.h"
#include "cohort/p2p/Wire.h"
#include "unit/p2p/SwarmLoopback.h"

namespace cohort::p2p {
namespace {

using namespace loopback;

#if COHORT_HAVE_SWARM

// Note [A part travels in pieces] (p2p/Averager.cpp): a part past kPieceBytes on the wire goes in
// pieces to the peers whose record says they read them, and every member gets the bits a round of whole
// parts gives, under each codec; a peer that sends whole parts (an earlier release) averages with the
// others as before.
TEST(SwarmAverager, PartsPastAPieceTravelInPiecesAndGiveTheBitsOfWholeParts) {
  EXPECT_EQ(p2p::piece_count(1000, p2p::Codec::kNone), 1);
  EXPECT_EQ(p2p::piece_count(p2p::kPieceBytes / 4 + 1, p2p::Codec::kNone), 2);
  EXPECT_EQ(p2p::piece_count(p2p::kPieceBytes / 4 + 1, p2p::Codec::kFp16), 1);
  EXPECT_EQ(p2p::piece_count(int64_t{1} << 30, p2p::Codec::kInt8), p2p::kMaxPieces);
  Logs logs;
  const auto run = p2p::generate_run_key();
  const auto d = no_heartbeat_within_a_test();
  std::vector<std::unique_ptr<Peer>> peers;
  for (int i = 0; i < 3; ++i)
    peers.push_back(std::make_unique<Peer>(run, 101 + i, i ? peers[0]->transport.address() : "", logs, d));
  // Each peer must hold the others' records (their features) for pieces to go.
  std::vector<std::pair<Peer*, p2p::PeerRecord>> records;
  for (auto& p : peers) records.push_back({p.get(), {{}, p->transport.address(), 0, 0, 1.0, false, false, 0}});
  ASSERT_TRUE(meet(records));
  const auto group = sorted({peers[0]->member(), peers[1]->member(), peers[2]->member()});
  torch::manual_seed(5);
  // Parts of 4.4 MB in fp32 (5 pieces), 2.2 MB in fp16 (3) and 1.1 MB in int8 (2, on its blocks).
  const int64_t n = 3 * 1'100'000;
  const std::vector<at::Tensor> values = {torch::randn({n}), torch::randn({n}), torch::randn({n})};
  const auto frames = [&](int i) {  // the averaging's: a heartbeat may come if the machine is slow
    const auto stats = peers[i]->transport.stats();
    return stats.frames_sent - stats.record_frames_sent;
  };
  // One round of all three; `whole[i]`: peer i sends whole parts, as an earlier release does.
  const auto round = [&](p2p::Codec codec, uint64_t step, std::array<bool, 3> whole) {
    return all_reduce_together(peers, group, values, step, frames, [&](int i) {
      p2p::AveragingOptions options{1.0, 10.0, 2};
      options.codec = codec;
      options.send_pieces = !whole[static_cast<size_t>(i)];
      return options;
    });
  };
  uint64_t step = 1;
  for (const auto codec : {p2p::Codec::kNone, p2p::Codec::kFp16, p2p::Codec::kInt8}) {
    const auto [whole, whole_frames] = round(codec, step++, {true, true, true});
    const auto [pieces, pieces_frames] = round(codec, step++, {false, false, false});
    const auto [mixed, mixed_frames] = round(codec, step++, {false, true, false});
    // Each peer sends 2 contributions and 2 results: 4 frames whole, 4 times the pieces in pieces.
    const int64_t per_part = p2p::piece_count(n / 3, codec);
    ASSERT_GT(per_part, 1) << "codec " << int(codec) << ": parts this size should go in pieces";
    for (int i = 0; i < 3; ++i) {
      for (const auto* out : {&whole[i], &pieces[i], &mixed[i]}) {
        EXPECT_TRUE(out->problem.empty()) << out->problem;
        EXPECT_EQ(out->parts_local, 0);
      }
      EXPECT_TRUE(torch::equal(pieces[i].averaged, whole[i].averaged)) << "codec " << int(codec) << ", member " << i;
      EXPECT_TRUE(torch::equal(mixed[i].averaged, whole[i].averaged)) << "codec " << int(codec) << ", member " << i;
      EXPECT_TRUE(torch::equal(whole[i].averaged, whole[0].averaged)) << "codec " << int(codec) << ", member " << i;
      EXPECT_EQ(whole_frames[i], 4);
      EXPECT_EQ(pieces_frames[i], 4 * per_part) << "codec " << int(codec) << ", member " << i;
      EXPECT_EQ(mixed_frames[i], i == 1 ? 4 : 4 * per_part) << "codec " << int(codec) << ", member " << i;
    }
  }
  EXPECT_TRUE(torch::allclose(std::get<0>(round(p2p::Codec::kNone, step, {false, false, false}))[0].averaged,
                              p2p::weighted_mean(values, {1, 2, 3}), 1e-6, 1e-6));
}

// Note [A part travels in pieces]: a member whose pieces stop halfway (it died after the first) is left
// out whole. Its first piece, which arrived, is not in the average, and the part it was to reduce stays
// each peer's own, as for a member that sent nothing.
TEST(SwarmAverager, AMemberWhosePiecesStopHalfwayIsLeftOutWhole) {
  Logs logs;
  const auto run = p2p::generate_run_key();
  std::vector<std::unique_ptr<Peer>> peers;
  for (int i = 0; i < 3; ++i)
    peers.push_back(std::make_unique<Peer>(run, 105 + i, i ? peers[0]->transport.address() : "", logs));
  const auto group = sorted({peers[0]->member(), peers[1]->member(), peers[2]->member()});
  auto& cut = *peers[2];
  const int64_t cut_index =
      std::find_if(group.begin(), group.end(), [&](const p2p::Member& m) { return m.key == cut.transport.key(); }) -
      group.begin();
  const int64_t n = 3 * 600'000;  // parts of 2.4 MB: 3 pieces
  // The cut member's first piece of each other member's part, as an Averager encodes it: weight 3, values 3.
  for (int64_t j = 0; j < 3; ++j) {
    if (j == cut_index) continue;
    const auto [b, e] = p2p::part_bounds(n, 3, j);
    ASSERT_EQ(p2p::piece_count(e - b, p2p::Codec::kNone), 3);
    const auto [pb, pe] = p2p::part_bounds(e - b, 3, 0);
    p2p::Writer w;
    w.f64(3.0);
    auto body = w.take();
    p2p::encode(torch::full({pe - pb}, 3.0f), p2p::Codec::kNone, body);
    cut.transport.send(group[static_cast<size_t>(j)].key, group[static_cast<size_t>(j)].address,
                       {p2p::MessageKind::kPart, 4, j}, body);
  }
  std::vector<p2p::RoundOutcome> out(2);
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i)
    threads.emplace_back([&, i] {
      // The two that send everything have half of 6 s to exchange 2.4 MB parts, ample on a loaded machine.
      p2p::Averager averager(peers[i]->transport, peers[i]->directory, {1.0, 6.0, 2});
      out[i] = averager.all_reduce(4, group, torch::full({n}, float(i + 1)), i + 1);
    });
  for (auto& t : threads) t.join();
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(out[i].contributions, 2);
    EXPECT_EQ(out[i].parts_local, 1);
    EXPECT_NE(out[i].problem.find("no contribution from " + p2p::peer_name(cut.transport.key())), std::string::npos)
        << out[i].problem;
    for (int64_t j = 0; j < 3; ++j) {
      const auto [b, e] = p2p::part_bounds(n, 3, j);
      // Weights 1 and 2 of values 1 and 2: 5 / 3 (with the cut member's first piece in it: 7 / 3 there).
      const float expected = j == cut_index ? float(i + 1) : 5.0f / 3;
      EXPECT_TRUE(torch::allclose(out[i].averaged.slice(0, b, e), torch::full({e - b}, expected)))
          << "member " << i << " part " << j;
    }
  }
}

#endif  // COHORT_HAVE_SWARM

}  // namespace
}  // namespace cohort::p2p

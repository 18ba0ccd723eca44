// Frames for one peer (p2p/Auth.h's seal_for): a MAC under the key two peers share in place of the
// sender's signature (Note [A frame for one peer carries a MAC, not a signature] in p2p/Frame.cpp), and a
// transport that sends them only to peers whose record says they read them; and the file where a peer says
// it listens. About 1 s.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "cohort/p2p/Auth.h"
#include "cohort/p2p/Transport.h"
#include "cohort/parallel/swarm/SwarmPeer.h"
#include "cohort/util/Error.h"

namespace cohort::p2p {
namespace {

constexpr int64_t kNow = 1'700'000'000;

class PairFrames : public ::testing::Test {
 protected:
  RunKey run_ = generate_run_key();
  PeerIdentity alice_ = issue_token(run_, std::chrono::hours(1), kNow);
  PeerIdentity bob_ = issue_token(run_, std::chrono::hours(1), kNow);
  PeerIdentity carol_ = issue_token(run_, std::chrono::hours(1), kNow);
  std::vector<uint8_t> payload_{1, 2, 3, 4, 5, 6, 7, 8, 9};

  // The reason open() gave `who`, or "" when it opened.
  std::string refusal(const std::vector<uint8_t>& frame, const PeerIdentity* who, int64_t now = kNow) const {
    auto opened = open(frame.data(), frame.size(), run_.public_key, now, who);
    const auto* reason = std::get_if<std::string>(&opened);
    return reason ? *reason : std::string();
  }
};

TEST_F(PairFrames, OnlyTheReceiverOpensOneAndItReadsAsASignedFrameWould) {
  const auto frame = seal_for(alice_, bob_.token.peer_public_key, 42, payload_);
  EXPECT_EQ(std::string(frame.begin(), frame.begin() + 4), "CSW3");
  EXPECT_EQ(frame.size(), kFrameOverheadBytes + payload_.size());  // the layout of a signed frame
  auto opened = open(frame.data(), frame.size(), run_.public_key, kNow, &bob_);
  ASSERT_TRUE(std::holds_alternative<Opened>(opened)) << std::get<std::string>(opened);
  const auto& f = std::get<Opened>(opened);
  EXPECT_EQ(f.payload, payload_);
  EXPECT_EQ(f.counter, 42u);
  EXPECT_EQ(f.token.peer_public_key, alice_.token.peer_public_key);
  EXPECT_EQ(f.receiver, bob_.token.peer_public_key);
  // Anyone else, or a reader without its identity, cannot check the MAC and refuses the frame.
  EXPECT_EQ(refusal(frame, &carol_), "a frame for another peer (its MAC is theirs to check)");
  EXPECT_EQ(refusal(frame, nullptr), "a frame for another peer (its MAC is theirs to check)");
  // Both directions use the one key the pair shares.
  EXPECT_EQ(refusal(seal_for(bob_, alice_.token.peer_public_key, 43, payload_), &alice_), "");
}

// Sealed where its payload lies (Note [Fewer copies of a frame's bytes]), a frame is the one seal and
// seal_for make (byte for byte where the tag has no nonce), and open_in_place reads it as open does,
// leaving the payload in the frame.
TEST_F(PairFrames, SealedInPlaceItIsTheSameFrameAndOpensWhereItLies) {
  enum class Kind { kSigned, kBlake2b, kPoly1305 };
  for (const auto kind : {Kind::kSigned, Kind::kBlake2b, Kind::kPoly1305}) {
    std::vector<uint8_t> frame(kFrameHeaderBytes + payload_.size(), 0xAB);  // room for the header, any value
    std::copy(payload_.begin(), payload_.end(), frame.begin() + kFrameHeaderBytes);
    const PublicKey& to = bob_.token.peer_public_key;
    const auto mac = kind == Kind::kBlake2b ? PairMac::kBlake2b : PairMac::kPoly1305;
    bool with_mac = false;
    if (kind == Kind::kSigned)
      seal_in_place(alice_, to, 42, frame);
    else
      with_mac = seal_for_in_place(alice_, to, 42, frame, mac);
    EXPECT_EQ(with_mac, kind != Kind::kSigned);
    const auto sealed =
        kind == Kind::kSigned ? seal(alice_, to, 42, payload_) : seal_for(alice_, to, 42, payload_, mac);
    const size_t random_tail = kind == Kind::kPoly1305 ? kFrameTagBytes : 0;  // a new nonce each time
    ASSERT_EQ(frame.size(), sealed.size());
    EXPECT_TRUE(std::equal(frame.begin(), frame.end() - random_tail, sealed.begin()));
    auto opened = open_in_place(frame.data(), frame.size(), run_.public_key, kNow, &bob_);
    ASSERT_TRUE(std::holds_alternative<Opened>(opened)) << std::get<std::string>(opened);
    const auto& f = std::get<Opened>(opened);
    EXPECT_TRUE(f.payload.empty());
    EXPECT_EQ(f.counter, 42u);
    EXPECT_EQ(f.token.peer_public_key, alice_.token.peer_public_key);
    EXPECT_EQ(std::vector<uint8_t>(frame.begin() + kFrameHeaderBytes, frame.end() - kFrameTagBytes), payload_);
    frame[kFrameHeaderBytes] ^= 1;  // a payload byte changed on the way
    opened = open_in_place(frame.data(), frame.size(), run_.public_key, kNow, &bob_);
    ASSERT_TRUE(std::holds_alternative<std::string>(opened));
    EXPECT_EQ(std::get<std::string>(opened), kind == Kind::kSigned ? "bad frame signature" : "bad frame MAC");
  }
  // Without room for its header a buffer is not sealed: a bug in the caller, said as one.
  std::vector<uint8_t> no_room(payload_);
  EXPECT_THROW(seal_in_place(alice_, bob_.token.peer_public_key, 1, no_room), std::logic_error);
}

// A frame for one peer carries a Poly1305 tag under a random nonce (Note [A frame for one peer carries a
// Poly1305 tag]); a peer of the previous release still gets, and sends, keyed BLAKE2b ("CSW2").
TEST_F(PairFrames, APoly1305TagUnderARandomNonceAndThePreviousReleasesMacStillRead) {
  const PublicKey& to = bob_.token.peer_public_key;
  const auto one = seal_for(alice_, to, 42, payload_), two = seal_for(alice_, to, 42, payload_);
  EXPECT_EQ(std::string(one.begin(), one.begin() + 4), "CSW3");
  EXPECT_NE(one, two) << "the same bytes sealed twice carry two nonces";
  EXPECT_EQ(refusal(one, &bob_), "");
  EXPECT_EQ(refusal(two, &bob_), "");
  const auto old = seal_for(alice_, to, 42, payload_, PairMac::kBlake2b);
  EXPECT_EQ(std::string(old.begin(), old.begin() + 4), "CSW2");
  EXPECT_EQ(old.size(), one.size());
  EXPECT_EQ(refusal(old, &bob_), "");
  EXPECT_EQ(refusal(old, &carol_), "a frame for another peer (its MAC is theirs to check)");
  // Each magic its own MAC: one frame's tag under the other's magic is refused.
  auto relabelled = old;
  relabelled[3] = '3';
  EXPECT_EQ(refusal(relabelled, &bob_), "bad frame MAC");
  relabelled = one;
  relabelled[3] = '2';
  EXPECT_EQ(refusal(relabelled, &bob_), "bad frame MAC");
}

TEST_F(PairFrames, AnyFlippedByteOrAnotherSendersTokenIsRefused) {
  for (const auto mac : {PairMac::kPoly1305, PairMac::kBlake2b})
    for (size_t i = 4; i < kFrameOverheadBytes + payload_.size(); ++i) {  // past the magic: another format
      auto bad = seal_for(alice_, bob_.token.peer_public_key, 7, payload_, mac);
      bad[i] ^= 0x80;  // the header, the payload, and all of the tag's field: nonce, tag and zeros
      EXPECT_NE(refusal(bad, &bob_), "") << "byte " << i << " flipped and still opened";
    }
  const auto frame = seal_for(alice_, bob_.token.peer_public_key, 7, payload_);
  auto payload_flipped = frame;
  payload_flipped[kFrameHeaderBytes + 1] ^= 0x01;
  EXPECT_EQ(refusal(payload_flipped, &bob_), "bad frame MAC");
  // Carol's valid token with Alice's frame, or a stolen token without its secret key: not the pair's key,
  // even in the process that already holds the pair's key for the real Alice.
  auto carols = seal_for(carol_, bob_.token.peer_public_key, 7, payload_);
  auto swapped = frame;
  std::copy(carols.begin() + 4, carols.begin() + 4 + 136, swapped.begin() + 4);
  EXPECT_EQ(refusal(swapped, &bob_), "bad frame MAC");
  const PeerIdentity thief{alice_.token, carol_.peer_secret_key};
  EXPECT_EQ(refusal(seal_for(thief, bob_.token.peer_public_key, 8, payload_), &bob_), "bad frame MAC");
}

TEST_F(PairFrames, TheTokenIsStillCheckedAndABroadcastIsStillSigned) {
  const auto stranger = issue_token(generate_run_key(), std::chrono::hours(1), kNow);
  EXPECT_EQ(refusal(seal_for(stranger, bob_.token.peer_public_key, 1, payload_), &bob_),
            "token refused: signed by another run key");
  EXPECT_EQ(refusal(seal_for(alice_, bob_.token.peer_public_key, 1, payload_), &bob_, kNow + 3600),
            "token refused: expired at 2023-11-14T23:13:20Z");
  // For every peer (a record, passed on and kept in the DHT) only a signature will do.
  const auto broadcast = seal_for(alice_, PublicKey{}, 2, payload_);
  EXPECT_EQ(std::string(broadcast.begin(), broadcast.begin() + 4), "CSW1");
  EXPECT_EQ(refusal(broadcast, nullptr), "");
  // claimed_header reads every kind, for dropping a stale record before any check.
  for (const auto mac : {PairMac::kPoly1305, PairMac::kBlake2b}) {
    const auto frame = seal_for(alice_, bob_.token.peer_public_key, 9, payload_, mac);
    const auto claimed = claimed_header(frame.data(), frame.size());
    ASSERT_TRUE(claimed.has_value());
    EXPECT_EQ(claimed->peer, alice_.token.peer_public_key);
    EXPECT_EQ(claimed->counter, 9u);
  }
  const auto claimed = claimed_header(broadcast.data(), broadcast.size());
  ASSERT_TRUE(claimed.has_value());
  EXPECT_EQ(claimed->counter, 2u);
}

// The transport sends a peer MAC frames once told it reads them (its record says so: the directory tells
// it, SwarmDirectory.ARecordChangeGoesToTheKnownPeersDirectly), and signed frames before, so a peer of the
// previous release, whose record has no features, keeps getting frames it can open.
TEST_F(PairFrames, ATransportSendsThemOnlyToPeersThatReadThem) {
  const auto now = static_cast<int64_t>(std::time(nullptr));
  Transport a(issue_token(run_, std::chrono::hours(1), now), run_.public_key, "127.0.0.1:0", [](const std::string&) {});
  Transport b(issue_token(run_, std::chrono::hours(1), now), run_.public_key, "127.0.0.1:0", [](const std::string&) {});
  const auto deadline = [] { return Clock::now() + std::chrono::seconds(5); };
  a.send(b.key(), b.address(), {MessageKind::kPart, 1, 0}, payload_);
  const auto first = b.receive({MessageKind::kPart, 1, 0}, deadline());
  ASSERT_TRUE(first);
  EXPECT_EQ(first->body, payload_);
  EXPECT_EQ(a.stats().frames_with_mac, 0);
  // bytes_sent counts a frame once its batch has left, on the transport's thread: the frame can arrive
  // first (seen: one frame counted of two, in make test). So the test waits, within the deadline, for the
  // count to reach what it checks.
  const auto sent_reaches = [&](int64_t bytes) {
    for (const auto by = deadline(); a.stats().bytes_sent < bytes && Clock::now() < by;)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return a.stats().bytes_sent;
  };
  const auto signed_bytes = sent_reaches(1);
  ASSERT_GT(signed_bytes, 0);
  // A peer of the previous release reads keyed BLAKE2b ("CSW2"), this release's a Poly1305 tag ("CSW3"):
  // each arrives and opens.
  int64_t round = 2;
  for (const auto mac : {PairMac::kBlake2b, PairMac::kPoly1305}) {
    a.reads_pair_frames(b.key(), mac);
    a.send(b.key(), b.address(), {MessageKind::kPart, static_cast<uint64_t>(round), 0}, payload_);
    const auto got = b.receive({MessageKind::kPart, static_cast<uint64_t>(round), 0}, deadline());
    ASSERT_TRUE(got);
    EXPECT_EQ(got->body, payload_);
    EXPECT_EQ(got->sender, a.key());
    EXPECT_EQ(a.stats().frames_with_mac, round - 1);
    EXPECT_EQ(sent_reaches(round * signed_bytes), round * signed_bytes);  // the same size every way
    ++round;
  }
  EXPECT_EQ(b.stats().frames_refused, 0);
}

}  // namespace
}  // namespace cohort::p2p

// cohort doctor --ask reads where each swarm peer listens (Note [Asking swarm peers for their records]):
// a run dir without the file is not a swarm peer's; a malformed one is an error naming the file and field.
TEST(SwarmPeerFile, AMissingFileIsNoPeerAndAMalformedOneIsNamed) {
  namespace fs = std::filesystem;
  const auto dir = fs::temp_directory_path() / ("cohort_peer_file_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "flight");
  EXPECT_FALSE(cohort::parallel::swarm::read_peer_file(dir).has_value());
  const auto write = [&](const std::string& text) { std::ofstream(dir / "flight" / "swarm.json") << text; };
  const auto error_of = [&] {
    try {
      cohort::parallel::swarm::read_peer_file(dir);
    } catch (const cohort::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  write("{\"format\": \"cohort-flight-record\", \"version\": 1}");
  EXPECT_NE(error_of().find("swarm.json is not a swarm peer's address file of version 1"), std::string::npos)
      << error_of();
  write(R"({"format": "cohort-swarm-peer", "version": 1, "address": "127.0.0.1:1", "peer_public_key": "zz"})");
  EXPECT_NE(error_of().find("swarm.json has a malformed \"peer_public_key\""), std::string::npos) << error_of();
  write(R"({"format": "cohort-swarm-peer", "version": 1, "address": "127.0.0.1:7000", "insecure": true,)"
        R"( "peer_public_key": ")" +
        std::string(64, 'a') + "\"}");
  const auto peer = cohort::parallel::swarm::read_peer_file(dir);
  ASSERT_TRUE(peer.has_value());
  EXPECT_EQ(peer->address, "127.0.0.1:7000");
  EXPECT_TRUE(peer->insecure);
  EXPECT_EQ(peer->peer[0], 0xaa);
  fs::remove_all(dir);
}

// Swarm authentication: key and token files round-trip privately and refuse bad content with clear errors;
// tokens from another run or past their expiry are refused; sealed frames open only when every byte is as
// sealed; the replay guard refuses repeats, old and far-off counters, and frames for other peers.
#include "cohort/p2p/Auth.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <functional>
#include <limits>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "cohort/util/Error.h"

namespace fs = std::filesystem;
using namespace cohort::p2p;

namespace {

constexpr int64_t kNow = 1'700'000'000;  // 2023-11-14T22:13:20Z
const PublicKey kBroadcast{};

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Runs `fn`, which must throw cohort::ConfigError, and returns the error for its message to be checked.
cohort::ConfigError config_error(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const cohort::ConfigError& e) {
    return e;
  }
  ADD_FAILURE() << "expected cohort::ConfigError";
  return cohort::ConfigError("none");
}

// The reason `open` gave, or "" when it opened.
std::string refusal(const std::vector<uint8_t>& frame, const PublicKey& run, int64_t now = kNow) {
  auto opened = open(frame.data(), frame.size(), run, now);
  const std::string* reason = std::get_if<std::string>(&opened);
  return reason ? *reason : std::string();
}

class SwarmAuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / ("cohort_swarm_auth_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path write_text(const std::string& name, const std::string& text) {
    fs::path p = dir_ / name;
    std::ofstream(p) << text;
    return p;
  }
  static std::string read_text(const fs::path& p) {
    std::ifstream in(p);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  static fs::perms mode(const fs::path& p) { return fs::status(p).permissions() & fs::perms::mask; }

  fs::path dir_;
  RunKey run_ = generate_run_key();
  PeerIdentity alice_ = issue_token(run_, std::chrono::hours(1), kNow);
  PeerIdentity bob_ = issue_token(run_, std::chrono::hours(1), kNow);
  std::vector<uint8_t> payload_{1, 2, 3, 4, 5};
};

constexpr fs::perms kOwnerOnly = fs::perms::owner_read | fs::perms::owner_write;

// --- Files ------------------------------------------------------------------------------------------------

TEST_F(SwarmAuthTest, RunKeyRoundTripsThroughFileWithMode0600) {
  fs::path p = dir_ / "run.key";
  save_run_key(run_, p);
  EXPECT_EQ(mode(p), kOwnerOnly);
  RunKey loaded = load_run_key(p);
  EXPECT_EQ(loaded.public_key, run_.public_key);
  EXPECT_EQ(loaded.secret_key, run_.secret_key);
  std::string text = read_text(p);
  EXPECT_TRUE(contains(text, "\"format\": \"cohort-swarm-run-key\"")) << text;
  EXPECT_TRUE(contains(text, "\"public_key\": \"" + hex(run_.public_key.data(), 32) + "\"")) << text;
  // Saving again over an existing key keeps it private and leaves no temporary behind.
  save_run_key(generate_run_key(), p);
  EXPECT_EQ(mode(p), kOwnerOnly);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1);
}

TEST_F(SwarmAuthTest, IdentityRoundTripsThroughFileWithMode0600) {
  fs::path p = dir_ / "peer.token";
  save_identity(alice_, p);
  EXPECT_EQ(mode(p), kOwnerOnly);
  PeerIdentity loaded = load_identity(p);
  EXPECT_EQ(loaded.token.run_public_key, run_.public_key);
  EXPECT_EQ(loaded.token.peer_public_key, alice_.token.peer_public_key);
  EXPECT_EQ(loaded.token.expires_unix, kNow + 3600);
  EXPECT_EQ(loaded.token.signature, alice_.token.signature);
  EXPECT_EQ(loaded.peer_secret_key, alice_.peer_secret_key);
  EXPECT_EQ(check_token(loaded.token, run_.public_key, kNow), "");
  // The loaded identity seals frames that open.
  EXPECT_EQ(refusal(seal(loaded, kBroadcast, 1, payload_), run_.public_key), "");
}

TEST_F(SwarmAuthTest, MissingRunKeyNamesPathAndHint) {
  fs::path p = dir_ / "absent.key";
  auto e = config_error([&] { load_run_key(p); });
  EXPECT_TRUE(contains(e.what(), p.string())) << e.what();
  EXPECT_TRUE(contains(e.what(), "does not exist")) << e.what();
  EXPECT_EQ(e.hint(), "create one with: cohort swarm keygen --out run.key");
}

TEST_F(SwarmAuthTest, MalformedRunKeysAreRefusedWithTheProblem) {
  std::string pk = hex(run_.public_key.data(), 32), sk = hex(run_.secret_key.data(), 64);
  auto doc = [&](const std::string& format, const std::string& version, const std::string& pub,
                 const std::string& sec) {
    return "{\"format\":\"" + format + "\",\"version\":" + version + ",\"public_key\":\"" + pub +
           "\",\"secret_key\":\"" + sec + "\"}";
  };
  RunKey other = generate_run_key();
  struct Case {
    std::string text, expect;
  } cases[] = {
      {"", "is empty"},
      {"{not json", "is not valid JSON"},
      {"[1,2]", "is not a JSON object"},
      {"{\"version\":1}", "has no \"format\""},
      {doc("something-else", "1", pk, sk), "has format \"something-else\""},
      {doc("cohort-swarm-token", "1", pk, sk), "is a peer token, not a run key"},
      {doc("cohort-swarm-run-key", "2", pk, sk), "has version 2"},
      {doc("cohort-swarm-run-key", "\"1\"", pk, sk), "has no integer \"version\""},
      {doc("cohort-swarm-run-key", "1", pk.substr(2), sk), "malformed \"public_key\""},
      {doc("cohort-swarm-run-key", "1", "zz" + pk.substr(2), sk), "malformed \"public_key\""},
      {doc("cohort-swarm-run-key", "1", pk, sk + "00"), "malformed \"secret_key\""},
      {doc("cohort-swarm-run-key", "1", hex(other.public_key.data(), 32), sk), "does not belong"},
  };
  for (const Case& c : cases) {
    fs::path p = write_text("bad.key", c.text);
    auto e = config_error([&] { load_run_key(p); });
    EXPECT_TRUE(contains(e.what(), p.string())) << e.what();
    EXPECT_TRUE(contains(e.what(), c.expect)) << "for " << c.text << "\ngot: " << e.what();
    EXPECT_FALSE(e.hint().empty());
  }
  // A file with the right format but a missing field names the field.
  fs::path p = write_text("partial.key", R"({"format":"cohort-swarm-run-key","version":1,"public_key":")" + pk + "\"}");
  EXPECT_TRUE(contains(config_error([&] { load_run_key(p); }).what(), "\"secret_key\""));
}

TEST_F(SwarmAuthTest, MissingOrDamagedIdentityIsRefusedWithHint) {
  const std::string hint = "issue one with: cohort swarm token --key run.key --ttl 24h --out peer.token";
  auto missing = config_error([&] { load_identity(dir_ / "absent.token"); });
  EXPECT_TRUE(contains(missing.what(), "absent.token")) << missing.what();
  EXPECT_EQ(missing.hint(), hint);

  fs::path key = dir_ / "run.key";
  save_run_key(run_, key);
  auto swapped = config_error([&] { load_identity(key); });
  EXPECT_TRUE(contains(swapped.what(), "is a run key, not a peer token")) << swapped.what();

  // Moving the expiry breaks the run key's signature, so an edited token is caught at load time.
  fs::path p = dir_ / "peer.token";
  save_identity(alice_, p);
  std::string text = read_text(p);
  std::string from = std::to_string(alice_.token.expires_unix), to = std::to_string(alice_.token.expires_unix + 1);
  text.replace(text.find(from), from.size(), to);
  write_text("peer.token", text);
  auto edited = config_error([&] { load_identity(p); });
  EXPECT_TRUE(contains(edited.what(), "signature does not verify")) << edited.what();

  // Bob's secret key under Alice's token.
  save_identity({alice_.token, bob_.peer_secret_key}, p);
  auto mixed = config_error([&] { load_identity(p); });
  EXPECT_TRUE(contains(mixed.what(), "does not belong")) << mixed.what();
}

// --- Tokens -----------------------------------------------------------------------------------------------

TEST_F(SwarmAuthTest, TokenFromOurRunIsValidUntilItsExpiry) {
  EXPECT_EQ(check_token(alice_.token, run_.public_key, kNow), "");
  EXPECT_EQ(check_token(alice_.token, run_.public_key, kNow + 3599), "");
  EXPECT_NE(alice_.token.peer_public_key, bob_.token.peer_public_key);  // each token gets a fresh peer key
}

TEST_F(SwarmAuthTest, TokenFromAnotherRunKeyIsRefused) {
  RunKey other = generate_run_key();
  PeerIdentity stranger = issue_token(other, std::chrono::hours(1), kNow);
  EXPECT_EQ(check_token(stranger.token, run_.public_key, kNow), "signed by another run key");
  // Claiming our run key does not help without our signature.
  Token forged = stranger.token;
  forged.run_public_key = run_.public_key;
  EXPECT_EQ(check_token(forged, run_.public_key, kNow), "bad signature");
}

TEST_F(SwarmAuthTest, ExpiredTokenIsRefusedWithItsExpiryTime) {
  EXPECT_EQ(check_token(alice_.token, run_.public_key, kNow + 3600), "expired at 2023-11-14T23:13:20Z");
  EXPECT_EQ(check_token(alice_.token, run_.public_key, kNow + 100000), "expired at 2023-11-14T23:13:20Z");
}

TEST_F(SwarmAuthTest, TokenWithEditedExpiryHasBadSignature) {
  Token extended = alice_.token;
  extended.expires_unix += 86400;
  EXPECT_EQ(check_token(extended, run_.public_key, kNow), "bad signature");
  // And is not reported as merely expired once past its real expiry.
  EXPECT_EQ(check_token(extended, run_.public_key, kNow + 7200), "bad signature");
}

TEST_F(SwarmAuthTest, IssueTokenRefusesNonPositiveLifetime) {
  EXPECT_TRUE(contains(config_error([&] { issue_token(run_, std::chrono::seconds(0), kNow); }).what(), "positive"));
  EXPECT_TRUE(contains(config_error([&] { issue_token(run_, std::chrono::seconds(-5), kNow); }).what(), "positive"));
  config_error([&] { issue_token(run_, std::chrono::seconds(std::numeric_limits<int64_t>::max()), kNow); });
}

TEST_F(SwarmAuthTest, InsecureRunKeyIsTheSameEverywhereAndWorks) {
  RunKey a = insecure_run_key(), b = insecure_run_key();
  EXPECT_EQ(a.public_key, b.public_key);
  EXPECT_EQ(a.secret_key, b.secret_key);
  EXPECT_NE(a.public_key, run_.public_key);
  PeerIdentity peer = issue_token(a, std::chrono::hours(1), kNow);
  EXPECT_EQ(check_token(peer.token, a.public_key, kNow), "");
  EXPECT_EQ(check_token(peer.token, run_.public_key, kNow), "signed by another run key");
  EXPECT_EQ(refusal(seal(peer, kBroadcast, 1, payload_), a.public_key), "");
}

TEST_F(SwarmAuthTest, PeerNameIsTheFirstEightHexCharacters) {
  PublicKey key{};
  key[0] = 0xde, key[1] = 0xad, key[2] = 0xbe, key[3] = 0xef, key[4] = 0x01;
  EXPECT_EQ(peer_name(key), "deadbeef");
  EXPECT_EQ(hex(key.data(), 5), "deadbeef01");
  EXPECT_EQ(peer_name(alice_.token.peer_public_key), hex(alice_.token.peer_public_key.data(), 32).substr(0, 8));
}

TEST_F(SwarmAuthTest, ParseTtlAcceptsEachUnit) {
  EXPECT_EQ(parse_ttl("90s"), std::chrono::seconds(90));
  EXPECT_EQ(parse_ttl("15m"), std::chrono::minutes(15));
  EXPECT_EQ(parse_ttl("24h"), std::chrono::hours(24));
  EXPECT_EQ(parse_ttl("7d"), std::chrono::hours(7 * 24));
  EXPECT_EQ(parse_ttl("1s"), std::chrono::seconds(1));
}

TEST_F(SwarmAuthTest, ParseTtlRefusesAnythingElse) {
  for (const char* bad : {"", "24", "h", "24x", "24H", "-1h", "+1h", " 1h", "1h ", "1.5h", "0s", "0d", "1e3s",
                          "99999999999999999999s", "999999999999999d"}) {
    auto e = config_error([&] { parse_ttl(bad); });
    EXPECT_TRUE(contains(e.what(), std::string("'") + bad + "'")) << e.what();
    EXPECT_TRUE(contains(e.hint(), "24h")) << e.hint();
  }
}

// --- Frames -----------------------------------------------------------------------------------------------

TEST_F(SwarmAuthTest, FrameRoundTrips) {
  std::vector<uint8_t> frame = seal(alice_, bob_.token.peer_public_key, 42, payload_);
  EXPECT_EQ(frame.size(), kFrameOverheadBytes + payload_.size());
  EXPECT_EQ(std::string(frame.begin(), frame.begin() + 4), "CSW1");
  auto opened = open(frame.data(), frame.size(), run_.public_key, kNow);
  ASSERT_TRUE(std::holds_alternative<Opened>(opened)) << std::get<std::string>(opened);
  const Opened& f = std::get<Opened>(opened);
  EXPECT_EQ(f.payload, payload_);
  EXPECT_EQ(f.counter, 42u);
  EXPECT_EQ(f.receiver, bob_.token.peer_public_key);
  EXPECT_EQ(f.token.peer_public_key, alice_.token.peer_public_key);
  EXPECT_EQ(f.token.expires_unix, alice_.token.expires_unix);
  EXPECT_EQ(f.token.signature, alice_.token.signature);

  std::vector<uint8_t> empty = seal(alice_, kBroadcast, 43, {});
  auto opened_empty = open(empty.data(), empty.size(), run_.public_key, kNow);
  ASSERT_TRUE(std::holds_alternative<Opened>(opened_empty));
  EXPECT_TRUE(std::get<Opened>(opened_empty).payload.empty());
  EXPECT_EQ(std::get<Opened>(opened_empty).receiver, kBroadcast);
}

TEST_F(SwarmAuthTest, FlippedPayloadByteIsRefused) {
  std::vector<uint8_t> frame = seal(alice_, kBroadcast, 1, payload_);
  frame[kFrameHeaderBytes + 2] ^= 0x01;
  EXPECT_EQ(refusal(frame, run_.public_key), "bad frame signature");
}

TEST_F(SwarmAuthTest, FlippedHeaderByteIsRefused) {
  std::vector<uint8_t> frame = seal(alice_, bob_.token.peer_public_key, 7, payload_);
  std::vector<uint8_t> counter = frame;
  counter[kFrameHeaderBytes - 16] ^= 0x01;  // lowest byte of the counter
  EXPECT_EQ(refusal(counter, run_.public_key), "bad frame signature");
  std::vector<uint8_t> magic = frame;
  magic[0] = 'X';
  EXPECT_TRUE(contains(refusal(magic, run_.public_key), "bad magic"));
  std::vector<uint8_t> token = frame;
  token[4 + 64] ^= 0x01;  // the token's expiry
  EXPECT_EQ(refusal(token, run_.public_key), "token refused: bad signature");
  // Whatever the byte, in header, payload or signature, a flip never opens.
  for (size_t i = 0; i < frame.size(); ++i) {
    std::vector<uint8_t> bad = frame;
    bad[i] ^= 0x80;
    EXPECT_NE(refusal(bad, run_.public_key), "") << "byte " << i << " flipped and still opened";
  }
}

TEST_F(SwarmAuthTest, TruncatedFrameIsRefused) {
  std::vector<uint8_t> frame = seal(alice_, kBroadcast, 1, payload_);
  EXPECT_TRUE(contains(refusal({frame.begin(), frame.end() - 1}, run_.public_key), "truncated frame"));
  EXPECT_TRUE(contains(refusal({frame.begin(), frame.begin() + 10}, run_.public_key), "truncated frame"));
  // Every prefix is refused; each is copied to its own buffer so a sanitizer sees any read past the end.
  for (size_t n = 0; n < frame.size(); ++n) {
    std::vector<uint8_t> prefix(frame.begin(), frame.begin() + n);
    EXPECT_NE(refusal(prefix, run_.public_key), "") << n << " bytes";
  }
  EXPECT_TRUE(contains(std::get<std::string>(open(nullptr, 0, run_.public_key, kNow)), "truncated"));
  // Trailing bytes are refused too.
  std::vector<uint8_t> padded = frame;
  padded.push_back(0);
  EXPECT_TRUE(contains(refusal(padded, run_.public_key), "length mismatch"));
}

TEST_F(SwarmAuthTest, HugeLengthFieldIsRefusedWithoutOverflow) {
  std::vector<uint8_t> frame = seal(alice_, kBroadcast, 1, payload_);
  for (size_t i = kFrameHeaderBytes - 8; i < kFrameHeaderBytes; ++i) frame[i] = 0xff;
  EXPECT_TRUE(contains(refusal(frame, run_.public_key), "truncated frame"));
}

TEST_F(SwarmAuthTest, ATokenVerifiedOnceIsStillRefusedWhenExpiredOrEdited) {
  // check_token remembers a token whose signature verified (Note [A token's signature is checked once]):
  // what it remembers must not let an expired or edited token through.
  EXPECT_EQ(check_token(alice_.token, run_.public_key, kNow), "");
  EXPECT_EQ(check_token(alice_.token, run_.public_key, kNow), "");
  EXPECT_EQ(check_token(alice_.token, run_.public_key, kNow + 3600), "expired at 2023-11-14T23:13:20Z");
  Token edited = alice_.token;
  edited.expires_unix += 86400;
  EXPECT_EQ(check_token(edited, run_.public_key, kNow), "bad signature");
  Token other_peer = alice_.token;
  other_peer.peer_public_key = bob_.token.peer_public_key;
  EXPECT_EQ(check_token(other_peer, run_.public_key, kNow), "bad signature");
  Token other_signature = alice_.token;
  other_signature.signature = bob_.token.signature;
  EXPECT_EQ(check_token(other_signature, run_.public_key, kNow), "bad signature");
  // Remembered under one run key, a token is not good for another's.
  const RunKey other = generate_run_key();
  EXPECT_EQ(check_token(alice_.token, other.public_key, kNow), "signed by another run key");
}

TEST_F(SwarmAuthTest, AFrameCarriedByItsOwnSenderIsVouchedForByTheCarrier) {
  std::vector<uint8_t> record = seal(alice_, kBroadcast, 9, payload_);
  record[kFrameHeaderBytes + 1] ^= 0x01;  // its own signature no longer matches
  const auto opened_by = [&](const PublicKey& carrier) {
    auto opened = open_carried(record.data(), record.size(), run_.public_key, kNow, carrier);
    const std::string* reason = std::get_if<std::string>(&opened);
    return reason ? *reason : std::string();
  };
  // Inside a frame Alice sealed, her own record's bytes are hers: that frame's signature covers them.
  EXPECT_EQ(opened_by(alice_.token.peer_public_key), "");
  // Carried by anyone else, or read from the DHT (no carrier), it is checked in full.
  EXPECT_EQ(opened_by(bob_.token.peer_public_key), "bad frame signature");
  EXPECT_EQ(opened_by(PublicKey{}), "bad frame signature");
  // Its token is checked even when it is vouched for.
  auto expired = open_carried(record.data(), record.size(), run_.public_key, kNow + 7200, alice_.token.peer_public_key);
  ASSERT_TRUE(std::holds_alternative<std::string>(expired));
  EXPECT_TRUE(contains(std::get<std::string>(expired), "expired")) << std::get<std::string>(expired);
}

TEST_F(SwarmAuthTest, ClaimedHeaderReadsTheSenderAndCounterWithoutTrustingThem) {
  const std::vector<uint8_t> frame = seal(alice_, bob_.token.peer_public_key, 1234, payload_);
  const auto claimed = claimed_header(frame.data(), frame.size());
  ASSERT_TRUE(claimed.has_value());
  EXPECT_EQ(claimed->peer, alice_.token.peer_public_key);
  EXPECT_EQ(claimed->counter, 1234u);
  EXPECT_FALSE(claimed_header(frame.data(), 10).has_value());
  EXPECT_FALSE(claimed_header(nullptr, 0).has_value());
  std::vector<uint8_t> not_a_frame = frame;
  not_a_frame[0] = 'X';
  EXPECT_FALSE(claimed_header(not_a_frame.data(), not_a_frame.size()).has_value());
}

TEST_F(SwarmAuthTest, FrameWithAnotherPeersTokenIsRefused) {
  // Alice's frame presented under Bob's (valid) token: the frame signature is Alice's, not Bob's.
  std::vector<uint8_t> frame = seal(alice_, kBroadcast, 1, payload_);
  std::vector<uint8_t> bobs = seal(bob_, kBroadcast, 1, payload_);
  std::copy(bobs.begin() + 4, bobs.begin() + 4 + 136, frame.begin() + 4);
  EXPECT_EQ(refusal(frame, run_.public_key), "bad frame signature");
  // A stolen token without its secret key is no use either.
  PeerIdentity thief{bob_.token, alice_.peer_secret_key};
  EXPECT_EQ(refusal(seal(thief, kBroadcast, 2, payload_), run_.public_key), "bad frame signature");
}

TEST_F(SwarmAuthTest, FrameFromAnotherRunOrExpiredTokenIsRefused) {
  PeerIdentity stranger = issue_token(generate_run_key(), std::chrono::hours(1), kNow);
  EXPECT_EQ(refusal(seal(stranger, kBroadcast, 1, payload_), run_.public_key),
            "token refused: signed by another run key");
  EXPECT_EQ(refusal(seal(alice_, kBroadcast, 1, payload_), run_.public_key, kNow + 3600),
            "token refused: expired at 2023-11-14T23:13:20Z");
}

TEST_F(SwarmAuthTest, RandomBytesNeverOpenAndNeverThrow) {
  std::mt19937 rng(1234);
  std::vector<uint8_t> good = seal(alice_, kBroadcast, 1, payload_);
  for (int i = 0; i < 2000; ++i) {
    std::vector<uint8_t> bytes(rng() % 400);
    for (auto& b : bytes) b = static_cast<uint8_t>(rng());
    // Half the time keep a valid prefix so the checks past the magic and the token get exercised too.
    if (i % 2 == 0) std::copy_n(good.begin(), std::min(bytes.size(), good.size() - 70), bytes.begin());
    EXPECT_NO_THROW(EXPECT_NE(refusal(bytes, run_.public_key), ""));
  }
}

// --- Replay -------------------------------------------------------------------------------------------------

class ReplayGuardTest : public ::testing::Test {
 protected:
  static constexpr uint64_t kNowNs = 1'700'000'000'000'000'000ull;
  static constexpr uint64_t kSecond = 1'000'000'000ull;
  PublicKey me_{1}, alice_{2}, bob_{3}, carol_{4};
  ReplayGuard guard_{std::chrono::seconds(120)};
};

TEST_F(ReplayGuardTest, AdmitsIncreasingCountersAddressedToUsOrEveryone) {
  EXPECT_EQ(guard_.admit(alice_, me_, me_, kNowNs, kNowNs), "");
  EXPECT_EQ(guard_.admit(alice_, kBroadcast, me_, kNowNs + 1, kNowNs), "");
  // Counters are per sender: Bob's first frame may carry a counter below Alice's latest.
  EXPECT_EQ(guard_.admit(bob_, me_, me_, kNowNs - 5, kNowNs), "");
}

TEST_F(ReplayGuardTest, RefusesTheSameCounterTwice) {
  EXPECT_EQ(guard_.admit(alice_, me_, me_, kNowNs, kNowNs), "");
  EXPECT_EQ(guard_.admit(alice_, me_, me_, kNowNs, kNowNs), "replayed frame");
}

TEST_F(ReplayGuardTest, RefusesALowerCounter) {
  EXPECT_EQ(guard_.admit(alice_, me_, me_, kNowNs, kNowNs), "");
  EXPECT_EQ(guard_.admit(alice_, me_, me_, kNowNs - 1, kNowNs), "replayed frame");
  EXPECT_EQ(guard_.admit(alice_, me_, me_, kNowNs + 1, kNowNs), "");
}

TEST_F(ReplayGuardTest, RefusesStaleAndFarFutureCounters) {
  EXPECT_EQ(guard_.admit(alice_, me_, me_, kNowNs - 121 * kSecond, kNowNs), "stale frame");
  EXPECT_EQ(guard_.admit(alice_, me_, me_, kNowNs + 121 * kSecond, kNowNs), "stale frame");
  EXPECT_EQ(guard_.admit(alice_, me_, me_, kNowNs - 119 * kSecond, kNowNs), "");  // inside the window
  // A refused stale frame did not raise the high-water mark.
  EXPECT_EQ(guard_.admit(bob_, me_, me_, kNowNs + 200 * kSecond, kNowNs), "stale frame");
  EXPECT_EQ(guard_.admit(bob_, me_, me_, kNowNs, kNowNs), "");
}

TEST_F(ReplayGuardTest, RefusesAFrameAddressedToAnotherPeer) {
  EXPECT_EQ(guard_.admit(alice_, bob_, me_, kNowNs, kNowNs), "addressed to another peer");
  // Refusal did not record the counter: the same counter addressed to us is still fresh.
  EXPECT_EQ(guard_.admit(alice_, me_, me_, kNowNs, kNowNs), "");
}

TEST_F(ReplayGuardTest, ForgettingQuietSendersDoesNotReopenTheirOldFrames) {
  EXPECT_EQ(guard_.admit(alice_, me_, me_, kNowNs, kNowNs), "");
  // Much later, another sender's frame prunes Alice's entry; her old frame replayed now is stale.
  uint64_t later = kNowNs + 1000 * kSecond;
  EXPECT_EQ(guard_.admit(bob_, me_, me_, later, later), "");
  EXPECT_EQ(guard_.admit(alice_, me_, me_, kNowNs, later), "stale frame");
}

TEST_F(ReplayGuardTest, ConcurrentAdmitsAcceptEachCounterOnce) {
  constexpr int kThreads = 8, kCounters = 2000;
  std::mutex mutex;
  std::multiset<uint64_t> admitted;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (uint64_t i = 0; i < kCounters; ++i) {
        if (!guard_.admit(carol_, kBroadcast, me_, kNowNs + i, kNowNs).empty()) continue;
        std::lock_guard<std::mutex> lock(mutex);
        admitted.insert(kNowNs + i);
      }
    });
  }
  for (auto& th : threads) th.join();
  // Every thread offers every counter in order; whichever thread is first to a counter above the high-water
  // mark admits it, and nobody else may. The last counter is always admitted, since only admitting it raises
  // the mark that far.
  for (uint64_t c : admitted) EXPECT_EQ(admitted.count(c), 1u) << "counter " << c - kNowNs << " admitted twice";
  EXPECT_EQ(admitted.count(kNowNs + kCounters - 1), 1u);
  EXPECT_EQ(guard_.admit(carol_, kBroadcast, me_, kNowNs + kCounters - 1, kNowNs), "replayed frame");
}

TEST(NextCounterTest, IsStrictlyIncreasingAcrossThreadsAndNearTheWallClock) {
  auto wall = [] {
    return static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
            .count());
  };
  uint64_t before = wall();
  uint64_t a = next_counter(), b = next_counter();
  EXPECT_LT(a, b);
  EXPECT_GE(a, before);
  EXPECT_LT(b - before, 60 * 1'000'000'000ull);

  constexpr int kThreads = 4, kEach = 5000;
  std::vector<std::vector<uint64_t>> seen(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) seen[t].push_back(next_counter());
    });
  }
  for (auto& th : threads) th.join();
  std::set<uint64_t> all;
  for (const auto& v : seen) {
    for (size_t i = 1; i < v.size(); ++i) EXPECT_LT(v[i - 1], v[i]);
    all.insert(v.begin(), v.end());
  }
  EXPECT_EQ(all.size(), size_t{kThreads * kEach});  // no two calls returned the same counter
}

TEST(ReplayGuardConfigTest, NonPositiveWindowIsAConfigError) {
  EXPECT_THROW(ReplayGuard(std::chrono::seconds(0)), cohort::ConfigError);
}

}  // namespace

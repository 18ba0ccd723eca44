#include "cohort/p2p/Auth.h"

#include <sodium.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <system_error>
#include <tuple>

#include "cohort/util/AtomicFile.h"
#include "cohort/util/Error.h"

namespace cohort::p2p {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;  // ordered so that saved files list format and version first

static_assert(crypto_sign_PUBLICKEYBYTES == 32 && crypto_sign_SECRETKEYBYTES == 64 && crypto_sign_BYTES == 64,
              "Auth.h sizes its keys for libsodium's Ed25519");

namespace {

constexpr char kRunKeyFormat[] = "cohort-swarm-run-key";
constexpr char kTokenFormat[] = "cohort-swarm-token";
constexpr int kFormatVersion = 1;
constexpr char kRunKeyHint[] = "create one with: cohort swarm keygen --out run.key";
constexpr char kTokenHint[] = "issue one with: cohort swarm token --key run.key --ttl 24h --out peer.token";
// Domain separation: a run key signs only this string followed by fixed-size fields, so no other message it
// might ever sign can be mistaken for a token.
constexpr char kTokenDomain[] = "cohort-swarm-token-v1";
constexpr uint8_t kFrameMagic[4] = {'C', 'S', 'W', '1'};      // signed: Ed25519 over the frame
constexpr uint8_t kPairFrameMagic[4] = {'C', 'S', 'W', '2'};  // for one peer: keyed BLAKE2b under the pair's key
constexpr uint8_t kPolyFrameMagic[4] = {'C', 'S', 'W', '3'};  // for one peer: a Poly1305 tag under the pair's key
bool has_magic(const uint8_t* frame, const uint8_t (&magic)[4]) { return std::memcmp(frame, magic, 4) == 0; }
constexpr size_t kTokenBytes = 32 + 32 + 8 + 64;

// libsodium must be initialised once before any other call; a function-local static makes that thread-safe.
void ensure_sodium() {
  static const bool ok = sodium_init() >= 0;  // 1 means another library already initialised it: fine
  if (!ok) throw Error("libsodium failed to initialise", "check that the system has a working /dev/urandom");
}

void put_u64(std::vector<uint8_t>& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
uint64_t get_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}
template <size_t N>
void put(std::vector<uint8_t>& out, const std::array<uint8_t, N>& a) {
  out.insert(out.end(), a.begin(), a.end());
}
template <size_t N>
std::array<uint8_t, N> get(const uint8_t* p) {
  std::array<uint8_t, N> a;
  std::memcpy(a.data(), p, N);
  return a;
}

std::vector<uint8_t> token_message(const PublicKey& run_pk, const PublicKey& peer_pk, int64_t expires_unix) {
  std::vector<uint8_t> msg(kTokenDomain, kTokenDomain + std::strlen(kTokenDomain));
  put(msg, run_pk);
  put(msg, peer_pk);
  put_u64(msg, static_cast<uint64_t>(expires_unix));
  return msg;
}

// True when `sk` is the libsodium secret key of `pk`: re-derive the pair from the seed half and compare, which
// catches a file whose halves were edited or copied from two different keys.
bool secret_matches(const SecretKey& sk, const PublicKey& pk) {
  uint8_t seed[crypto_sign_SEEDBYTES];
  PublicKey derived_pk;
  SecretKey derived_sk;
  crypto_sign_ed25519_sk_to_seed(seed, sk.data());
  crypto_sign_seed_keypair(derived_pk.data(), derived_sk.data(), seed);
  bool same = derived_pk == pk && sodium_memcmp(derived_sk.data(), sk.data(), sk.size()) == 0;
  sodium_memzero(seed, sizeof seed);
  sodium_memzero(derived_sk.data(), derived_sk.size());
  return same;
}

std::string utc_time(int64_t unix_seconds) {
  std::time_t t = static_cast<std::time_t>(unix_seconds);
  std::tm tm{};
  if (gmtime_r(&t, &tm) == nullptr) return std::to_string(unix_seconds) + " (Unix seconds)";
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// --- Key files --------------------------------------------------------------------------------------------

// What a loader expects of a file, so that every complaint names the file, what it should be, and the fix.
struct FileKind {
  const char* what;          // "run key"
  const char* format;        // kRunKeyFormat
  const char* other_what;    // the kind people confuse it with
  const char* other_format;  //
  const char* hint;
};
constexpr FileKind kRunKeyFile{"run key", kRunKeyFormat, "peer token", kTokenFormat, kRunKeyHint};
constexpr FileKind kTokenFile{"peer token", kTokenFormat, "run key", kRunKeyFormat, kTokenHint};

[[noreturn]] void bad_file(const FileKind& kind, const fs::path& path, const std::string& problem,
                           const std::string& hint = {}) {
  throw ConfigError(std::string(kind.what) + " file '" + path.string() + "' " + problem,
                    hint.empty() ? kind.hint : hint);
}

Json read_json(const FileKind& kind, const fs::path& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) bad_file(kind, path, "does not exist");
  if (fs::is_directory(path, ec)) bad_file(kind, path, "is a directory, not a file");
  std::ifstream in(path, std::ios::binary);
  if (!in.is_open()) bad_file(kind, path, "cannot be opened", "check the file's permissions");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) bad_file(kind, path, "cannot be read", "check the file and the disk it is on");
  if (text.empty()) bad_file(kind, path, "is empty");
  Json doc;
  try {
    doc = Json::parse(text);
  } catch (const Json::exception& e) {
    bad_file(kind, path, std::string("is not valid JSON: ") + e.what());
  }
  if (!doc.is_object()) bad_file(kind, path, "is not a JSON object");
  auto format = doc.find("format");
  if (format == doc.end() || !format->is_string()) bad_file(kind, path, "has no \"format\" field");
  if (*format == kind.other_format)
    bad_file(kind, path, std::string("is a ") + kind.other_what + ", not a " + kind.what);
  if (*format != kind.format)
    bad_file(kind, path, "has format \"" + format->get<std::string>() + "\", expected \"" + kind.format + "\"");
  auto version = doc.find("version");
  if (version == doc.end() || !version->is_number_integer()) bad_file(kind, path, "has no integer \"version\"");
  if (*version != kFormatVersion)
    bad_file(kind, path,
             "has version " + version->dump() + "; this cohort reads version " + std::to_string(kFormatVersion),
             std::string("use the cohort that wrote it, or ") + kind.hint);
  return doc;
}

template <size_t N>
std::array<uint8_t, N> hex_field(const FileKind& kind, const fs::path& path, const Json& doc, const char* name) {
  auto it = doc.find(name);
  if (it == doc.end() || !it->is_string()) bad_file(kind, path, std::string("has no \"") + name + "\" string");
  const std::string& text = it->get_ref<const std::string&>();
  std::array<uint8_t, N> out{};
  size_t len = 0;
  const char* end = nullptr;
  if (text.size() != 2 * N || sodium_hex2bin(out.data(), N, text.data(), text.size(), nullptr, &len, &end) != 0 ||
      len != N || end != text.data() + text.size())
    bad_file(kind, path,
             std::string("has a malformed \"") + name + "\": expected " + std::to_string(2 * N) + " hex characters");
  return out;
}

// Key files hold secrets: never readable by anyone else (util::write_private_file_atomic).
void write_private(const fs::path& path, const Json& doc) { util::write_private_file_atomic(path, doc.dump(2) + "\n"); }

}  // namespace

std::string hex(const uint8_t* data, size_t size) {
  std::string out(2 * size + 1, '\0');
  sodium_bin2hex(out.data(), out.size(), data, size);
  out.pop_back();
  return out;
}

std::string peer_name(const PublicKey& peer_public_key) { return hex(peer_public_key.data(), 4); }

std::string claimed_sender(const uint8_t* frame, size_t size) {
  constexpr size_t kPeerKeyAt = 4 + 32;  // after the magic and the token's run key
  if (frame == nullptr || size < kPeerKeyAt + 32) return "unknown";
  return hex(frame + kPeerKeyAt, 4);
}

std::optional<Claimed> claimed_header(const uint8_t* frame, size_t size) {
  if (frame == nullptr || size < kFrameHeaderBytes ||
      !(has_magic(frame, kFrameMagic) || has_magic(frame, kPairFrameMagic) || has_magic(frame, kPolyFrameMagic)))
    return std::nullopt;
  const uint8_t* p = frame + sizeof kFrameMagic;
  return Claimed{get<32>(p + 32), get_u64(p + kTokenBytes + 32)};
}

RunKey generate_run_key() {
  ensure_sodium();
  RunKey key;
  crypto_sign_keypair(key.public_key.data(), key.secret_key.data());
  return key;
}

RunKey insecure_run_key() {
  ensure_sodium();
  // Exactly crypto_sign_SEEDBYTES characters, no terminator; changing it splits insecure swarms across versions.
  static constexpr char kSeed[] = "cohort-swarm-insecure-run-key-v1";
  static_assert(sizeof kSeed - 1 == crypto_sign_SEEDBYTES, "the insecure seed must be one Ed25519 seed");
  RunKey key;
  crypto_sign_seed_keypair(key.public_key.data(), key.secret_key.data(), reinterpret_cast<const uint8_t*>(kSeed));
  return key;
}

void save_run_key(const RunKey& key, const fs::path& path) {
  Json doc;
  doc["format"] = kRunKeyFormat;
  doc["version"] = kFormatVersion;
  doc["public_key"] = hex(key.public_key.data(), key.public_key.size());
  doc["secret_key"] = hex(key.secret_key.data(), key.secret_key.size());
  write_private(path, doc);
}

RunKey load_run_key(const fs::path& path) {
  ensure_sodium();
  Json doc = read_json(kRunKeyFile, path);
  RunKey key;
  key.public_key = hex_field<32>(kRunKeyFile, path, doc, "public_key");
  key.secret_key = hex_field<64>(kRunKeyFile, path, doc, "secret_key");
  if (!secret_matches(key.secret_key, key.public_key))
    bad_file(kRunKeyFile, path, "is corrupt: its secret key does not belong to its public key");
  return key;
}

PeerIdentity issue_token(const RunKey& run, std::chrono::seconds ttl, int64_t now_unix) {
  ensure_sodium();
  if (ttl.count() <= 0)
    throw ConfigError("token lifetime must be positive, got " + std::to_string(ttl.count()) + "s",
                      "pass a lifetime such as --ttl 24h");
  if (now_unix > 0 && ttl.count() > std::numeric_limits<int64_t>::max() - now_unix)
    throw ConfigError("token lifetime " + std::to_string(ttl.count()) + "s is too long", "pass a shorter --ttl");
  PeerIdentity id;
  Token& t = id.token;
  crypto_sign_keypair(t.peer_public_key.data(), id.peer_secret_key.data());
  t.run_public_key = run.public_key;
  t.expires_unix = now_unix + ttl.count();
  std::vector<uint8_t> msg = token_message(t.run_public_key, t.peer_public_key, t.expires_unix);
  crypto_sign_detached(t.signature.data(), nullptr, msg.data(), msg.size(), run.secret_key.data());
  return id;
}

void save_identity(const PeerIdentity& id, const fs::path& path) {
  const Token& t = id.token;
  Json doc;
  doc["format"] = kTokenFormat;
  doc["version"] = kFormatVersion;
  doc["run_public_key"] = hex(t.run_public_key.data(), t.run_public_key.size());
  doc["peer_public_key"] = hex(t.peer_public_key.data(), t.peer_public_key.size());
  doc["expires_unix"] = t.expires_unix;
  doc["signature"] = hex(t.signature.data(), t.signature.size());
  doc["peer_secret_key"] = hex(id.peer_secret_key.data(), id.peer_secret_key.size());
  write_private(path, doc);
}

PeerIdentity load_identity(const fs::path& path) {
  ensure_sodium();
  Json doc = read_json(kTokenFile, path);
  PeerIdentity id;
  Token& t = id.token;
  t.run_public_key = hex_field<32>(kTokenFile, path, doc, "run_public_key");
  t.peer_public_key = hex_field<32>(kTokenFile, path, doc, "peer_public_key");
  auto expires = doc.find("expires_unix");
  if (expires == doc.end() || !expires->is_number_integer())
    bad_file(kTokenFile, path, "has no integer \"expires_unix\"");
  t.expires_unix = expires->get<int64_t>();
  t.signature = hex_field<64>(kTokenFile, path, doc, "signature");
  id.peer_secret_key = hex_field<64>(kTokenFile, path, doc, "peer_secret_key");
  // Checked against the run key the token names, not ours: this catches a damaged file now rather than as
  // "bad signature" on every peer later. Whether the run key is the right one is check_token's job.
  std::vector<uint8_t> msg = token_message(t.run_public_key, t.peer_public_key, t.expires_unix);
  if (crypto_sign_verify_detached(t.signature.data(), msg.data(), msg.size(), t.run_public_key.data()) != 0)
    bad_file(kTokenFile, path, "is corrupt: its signature does not verify");
  if (!secret_matches(id.peer_secret_key, t.peer_public_key))
    bad_file(kTokenFile, path, "is corrupt: its secret key does not belong to its peer public key");
  return id;
}

namespace {
[[noreturn]] void bad_ttl(const std::string& text, const std::string& problem) {
  throw ConfigError("token lifetime '" + text + "' " + problem,
                    "write a positive whole number and a unit: 90s, 15m, 24h or 7d");
}
}  // namespace

std::chrono::seconds parse_ttl(const std::string& text) {
  if (text.empty()) bad_ttl(text, "is empty");
  int64_t unit = 0;
  switch (text.back()) {
    case 's': unit = 1; break;
    case 'm': unit = 60; break;
    case 'h': unit = 3600; break;
    case 'd': unit = 86400; break;
    default: bad_ttl(text, "has no unit (s, m, h or d)");
  }
  const char* first = text.data();
  const char* last = text.data() + text.size() - 1;
  if (first == last) bad_ttl(text, "has no number before its unit");
  // Only digits: no sign, space or fraction, so "-1h", " 1h" and "1.5h" are refused rather than half-read.
  if (!std::all_of(first, last, [](char c) { return c >= '0' && c <= '9'; })) bad_ttl(text, "is not a whole number");
  int64_t n = 0;
  auto [end, ec] = std::from_chars(first, last, n);
  if (ec != std::errc() || end != last || n > std::numeric_limits<int64_t>::max() / unit) bad_ttl(text, "is too long");
  if (n == 0) bad_ttl(text, "is not positive");
  return std::chrono::seconds(n * unit);
}

// Note [A token's signature is checked once]
// Every frame and every record carries its sender's token, and open() checked the run key's signature on
// it each time: two Ed25519 verifications per frame or record, where the token is one of a few hundred
// that never change. At 64 swarm peers on 2 cores, libsodium took 74% of the machine (perf, issue 41),
// and rounds failed for want of CPU. A token whose signature verified is remembered, by all of its
// bytes (the run key that signed it among them), so it is checked once per process; its expiry is still
// checked at every use. Only a good signature is remembered (a forged token costs its sender a
// verification each time, as before), and the set is emptied when it reaches kMaxVerifiedTokens, far
// above any run's peers.
namespace {
class VerifiedTokens {
 public:
  static VerifiedTokens& instance() {
    static VerifiedTokens tokens;
    return tokens;
  }
  bool contains(const Token& t) {
    std::lock_guard lock(mutex_);
    return verified_.count(key(t)) > 0;
  }
  void add(const Token& t) {
    std::lock_guard lock(mutex_);
    if (verified_.size() >= kMaxVerifiedTokens) verified_.clear();
    verified_.insert(key(t));
  }

 private:
  static constexpr size_t kMaxVerifiedTokens = 65536;
  // All of a token: what the run key signed, and the signature.
  using Key = std::tuple<PublicKey, PublicKey, int64_t, Signature>;
  static Key key(const Token& t) { return {t.run_public_key, t.peer_public_key, t.expires_unix, t.signature}; }
  std::mutex mutex_;
  std::set<Key> verified_;
};
}  // namespace

std::string check_token(const Token& token, const PublicKey& our_run_public_key, int64_t now_unix) {
  ensure_sodium();
  if (token.run_public_key != our_run_public_key) return kTokenOfAnotherRun;
  // The signature is checked before the expiry so that "expired" is only ever said of a token the run issued.
  // A remembered token holds its run key, which is ours here: it is never taken for another run's.
  auto& verified = VerifiedTokens::instance();
  if (!verified.contains(token)) {
    const auto msg = token_message(token.run_public_key, token.peer_public_key, token.expires_unix);
    if (crypto_sign_verify_detached(token.signature.data(), msg.data(), msg.size(), our_run_public_key.data()) != 0)
      return "bad signature";
    verified.add(token);
  }
  if (now_unix >= token.expires_unix) return "expired at " + utc_time(token.expires_unix);
  return {};
}

// --- Frames -----------------------------------------------------------------------------------------------

namespace {

// Writes the frame's header (magic, token, receiver, counter, length) into the room at the front of
// `frame`, which holds kFrameHeaderBytes of it followed by the payload.
void write_header(const uint8_t (&magic)[4], const PeerIdentity& me, const PublicKey& receiver_public_key,
                  uint64_t counter, std::vector<uint8_t>& frame) {
  COHORT_ASSERT(frame.size() >= kFrameHeaderBytes, "a frame to seal in place starts with room for its header");
  const Token& t = me.token;
  std::vector<uint8_t> header;
  header.reserve(kFrameHeaderBytes);
  header.insert(header.end(), std::begin(magic), std::end(magic));
  put(header, t.run_public_key);
  put(header, t.peer_public_key);
  put_u64(header, static_cast<uint64_t>(t.expires_unix));
  put(header, t.signature);
  put(header, receiver_public_key);
  put_u64(header, counter);
  put_u64(header, frame.size() - kFrameHeaderBytes);
  std::memcpy(frame.data(), header.data(), kFrameHeaderBytes);
}

// `payload` after room for the header, and room for the tag.
std::vector<uint8_t> with_room(const std::vector<uint8_t>& payload) {
  std::vector<uint8_t> frame;
  frame.reserve(kFrameOverheadBytes + payload.size());
  frame.resize(kFrameHeaderBytes);
  frame.insert(frame.end(), payload.begin(), payload.end());
  return frame;
}

// Note [A frame for one peer carries a MAC, not a signature]
// Every frame was signed with the sender's Ed25519 key and verified on arrival. At 64 swarm peers on the
// AVX2-only 2-core machine that verification (open) was 41% of a peer's CPU and signing 11% (perf, issue
// 41): a record goes to every peer in its own frame, each signed for its receiver, and training itself was
// under 2%. A frame addressed to one peer needs only that the receiver can tell it came from the sender,
// which a MAC under a key the two share gives, as TLS and Noise do after their handshake: the pair's key
// is the X25519 agreement of the two peers' keys (libsodium converts Ed25519 keys to X25519), hashed with
// both public keys, computed once per pair and process and remembered (kMaxPairKeys, as VerifiedTokens).
// The tag is keyed BLAKE2b-512 over the frame, so the frame's size and layout stay those of a signed one.
// Frames for every peer (records, which are passed on and kept in the DHT) stay signed: only a signature
// can be checked by a third peer. The token in the frame is still checked (run membership and expiry), and
// the replay guard as before. What is given up: a peer whose secret key leaked could be sent forged frames
// in anyone's name (key-compromise impersonation); with that key the peer is anyone's already. Peers of
// the previous release do not read these frames, so a sender uses them only for peers whose record says
// they do (PeerRecord::kPairFrames, p2p/Directory.h).
// What two peers share: the key of their "CSW2" frames' BLAKE2b and the one of their "CSW3" frames' Poly1305.
struct PairKey {
  std::array<uint8_t, 32> blake2b{};
  std::array<uint8_t, 32> poly{};
};

class PairKeys {
 public:
  static PairKeys& instance() {
    static PairKeys keys;
    return keys;
  }
  // The keys `me` shares with `peer`; nullopt for a key that is not a point of the curve.
  std::optional<PairKey> get(const PeerIdentity& me, const PublicKey& peer) {
    // Keyed by the public half of the secret key used, not by the token's claim: an identity holding
    // another peer's token with its own secret key must not be handed that peer's pair keys.
    PublicKey mine{};
    crypto_sign_ed25519_sk_to_pk(mine.data(), me.peer_secret_key.data());
    const auto id = std::make_pair(mine, peer);
    {
      std::lock_guard lock(mutex_);
      if (auto it = keys_.find(id); it != keys_.end()) return it->second;
    }
    auto key = derive(me, peer);
    if (!key) return std::nullopt;
    std::lock_guard lock(mutex_);
    if (keys_.size() >= kMaxPairKeys) keys_.clear();
    keys_.emplace(id, *key);
    return key;
  }

 private:
  static constexpr size_t kMaxPairKeys = 65536;
  static std::optional<PairKey> derive(const PeerIdentity& me, const PublicKey& peer) {
    std::array<uint8_t, 32> my_x{}, their_x{}, shared{}, key{};
    if (crypto_sign_ed25519_sk_to_curve25519(my_x.data(), me.peer_secret_key.data()) != 0 ||
        crypto_sign_ed25519_pk_to_curve25519(their_x.data(), peer.data()) != 0 ||
        crypto_scalarmult(shared.data(), my_x.data(), their_x.data()) != 0)
      return std::nullopt;
    // Both public keys in a fixed order, so both peers hash the same bytes.
    const auto& lo = std::min(me.token.peer_public_key, peer);
    const auto& hi = std::max(me.token.peer_public_key, peer);
    static constexpr char kDomain[] = "cohort-swarm-pair-key-v1";
    crypto_generichash_state st;
    crypto_generichash_init(&st, reinterpret_cast<const uint8_t*>(kDomain), sizeof kDomain - 1, key.size());
    crypto_generichash_update(&st, shared.data(), shared.size());
    crypto_generichash_update(&st, lo.data(), lo.size());
    crypto_generichash_update(&st, hi.data(), hi.size());
    crypto_generichash_final(&st, key.data(), key.size());
    sodium_memzero(my_x.data(), my_x.size());
    sodium_memzero(shared.data(), shared.size());
    // Note [A frame for one peer carries a Poly1305 tag]: its own key, derived from the pair's.
    PairKey both{key, {}};
    crypto_kdf_derive_from_key(both.poly.data(), both.poly.size(), 1, "cohortpf", key.data());
    return both;
  }
  std::mutex mutex_;
  std::map<std::pair<PublicKey, PublicKey>, PairKey> keys_;
};

Signature pair_tag(const std::array<uint8_t, 32>& key, const uint8_t* data, size_t size) {
  Signature tag;
  crypto_generichash(tag.data(), tag.size(), data, size, key.data(), key.size());
  return tag;
}

// Note [A frame for one peer carries a Poly1305 tag]
// The keyed BLAKE2b of a "CSW2" frame ran at 660 to 830 MB/s, and on loopback it was half of a swarm
// peer's CPU while it averaged ResNet-18 (perf, 2026-12-03): every byte is hashed once by its sender and
// once by its receiver. A "CSW3" frame carries a Poly1305 tag instead, the MAC of TLS 1.3 and WireGuard,
// at about 3.9 GB/s here, through libsodium's XChaCha20-Poly1305 with the frame as its associated data and
// no message: ChaCha20 makes a one-time Poly1305 key from the pair's key and a random 24-byte nonce, so a
// nonce repeats with negligible odds however many frames a pair sends, in either direction, across
// restarts. The 64 bytes after the frame hold the nonce, the 16-byte tag and 24 zero bytes, so the frame's
// size and layout stay a signed one's; the zeros are checked. The key is the pair's BLAKE2b key put
// through libsodium's KDF (one key, one algorithm). A peer says in its record that it reads these
// (PeerRecord::kPolyPairFrames, p2p/Directory.h); a peer of the previous release still gets "CSW2".
constexpr size_t kPolyNonceBytes = crypto_aead_xchacha20poly1305_ietf_NPUBBYTES;
constexpr size_t kPolyTagBytes = crypto_aead_xchacha20poly1305_ietf_ABYTES;
static_assert(kPolyNonceBytes + kPolyTagBytes <= kFrameTagBytes, "a CSW3 frame's tag field holds its nonce and tag");

Signature poly_tag(const std::array<uint8_t, 32>& key, const uint8_t* data, size_t size) {
  Signature field{};
  randombytes_buf(field.data(), kPolyNonceBytes);
  uint8_t none = 0;
  crypto_aead_xchacha20poly1305_ietf_encrypt_detached(&none, field.data() + kPolyNonceBytes, nullptr, &none, 0, data,
                                                      size, nullptr, field.data(), key.data());
  return field;
}

bool poly_tag_holds(const std::array<uint8_t, 32>& key, const uint8_t* data, size_t size, const uint8_t* field) {
  if (!sodium_is_zero(field + kPolyNonceBytes + kPolyTagBytes, kFrameTagBytes - kPolyNonceBytes - kPolyTagBytes))
    return false;
  uint8_t none = 0;
  return crypto_aead_xchacha20poly1305_ietf_decrypt_detached(&none, nullptr, &none, 0, field + kPolyNonceBytes, data,
                                                             size, field, key.data()) == 0;
}

}  // namespace

void seal_in_place(const PeerIdentity& me, const PublicKey& receiver_public_key, uint64_t counter,
                   std::vector<uint8_t>& frame) {
  ensure_sodium();
  write_header(kFrameMagic, me, receiver_public_key, counter, frame);
  Signature sig;
  crypto_sign_detached(sig.data(), nullptr, frame.data(), frame.size(), me.peer_secret_key.data());
  put(frame, sig);
}

bool seal_for_in_place(const PeerIdentity& me, const PublicKey& receiver_public_key, uint64_t counter,
                       std::vector<uint8_t>& frame, PairMac mac) {
  ensure_sodium();
  const auto key =
      receiver_public_key == PublicKey{} ? std::nullopt : PairKeys::instance().get(me, receiver_public_key);
  if (!key) {
    seal_in_place(me, receiver_public_key, counter, frame);
    return false;
  }
  if (mac == PairMac::kPoly1305) {
    write_header(kPolyFrameMagic, me, receiver_public_key, counter, frame);
    put(frame, poly_tag(key->poly, frame.data(), frame.size()));
  } else {
    write_header(kPairFrameMagic, me, receiver_public_key, counter, frame);
    put(frame, pair_tag(key->blake2b, frame.data(), frame.size()));
  }
  return true;
}

std::vector<uint8_t> seal(const PeerIdentity& me, const PublicKey& receiver_public_key, uint64_t counter,
                          const std::vector<uint8_t>& payload) {
  auto frame = with_room(payload);
  seal_in_place(me, receiver_public_key, counter, frame);
  return frame;
}

std::vector<uint8_t> seal_for(const PeerIdentity& me, const PublicKey& receiver_public_key, uint64_t counter,
                              const std::vector<uint8_t>& payload, PairMac mac) {
  auto frame = with_room(payload);
  seal_for_in_place(me, receiver_public_key, counter, frame, mac);
  return frame;
}

std::variant<Opened, std::string> open(const uint8_t* data, size_t size, const PublicKey& our_run_public_key,
                                       int64_t now_unix, const PeerIdentity* me) {
  return open_carried(data, size, our_run_public_key, now_unix, PublicKey{}, me);
}

std::variant<Opened, std::string> open_carried(const uint8_t* data, size_t size, const PublicKey& our_run_public_key,
                                               int64_t now_unix, const PublicKey& carrier, const PeerIdentity* me) {
  auto opened = open_in_place(data, size, our_run_public_key, now_unix, me, carrier);
  if (auto* f = std::get_if<Opened>(&opened)) f->payload.assign(data + kFrameHeaderBytes, data + size - kFrameTagBytes);
  return opened;
}

std::variant<Opened, std::string> open_in_place(const uint8_t* data, size_t size, const PublicKey& our_run_public_key,
                                                int64_t now_unix, const PeerIdentity* me, const PublicKey& carrier) {
  ensure_sodium();
  if (data == nullptr || size < kFrameOverheadBytes)
    return "truncated frame: " + std::to_string(size) + " bytes, a frame has at least " +
           std::to_string(kFrameOverheadBytes);
  const bool poly = has_magic(data, kPolyFrameMagic), pair = poly || has_magic(data, kPairFrameMagic);
  if (!pair && !has_magic(data, kFrameMagic)) return std::string("bad magic: not a swarm frame");
  // Every offset below is a constant under kFrameHeaderBytes, which the size check above guarantees.
  const uint8_t* p = data + sizeof kFrameMagic;
  Opened f;
  f.token.run_public_key = get<32>(p);
  f.token.peer_public_key = get<32>(p + 32);
  f.token.expires_unix = static_cast<int64_t>(get_u64(p + 64));
  f.token.signature = get<64>(p + 72);
  p += kTokenBytes;
  f.receiver = get<32>(p);
  f.counter = get_u64(p + 32);
  uint64_t length = get_u64(p + 40);
  // Compared without arithmetic on `length`, which an attacker chooses, so nothing can overflow.
  const uint64_t held = size - kFrameOverheadBytes;
  if (length != held)
    return std::string(length > held ? "truncated frame" : "length mismatch") + ": header says " +
           std::to_string(length) + " payload bytes, frame holds " + std::to_string(held);
  if (std::string reason = check_token(f.token, our_run_public_key, now_unix); !reason.empty())
    return "token refused: " + reason;
  const size_t signed_bytes = size - crypto_sign_BYTES;
  if (pair) {  // Note [A frame for one peer carries a MAC, not a signature]
    if (me == nullptr || f.receiver != me->token.peer_public_key)
      return std::string("a frame for another peer (its MAC is theirs to check)");
    const auto key = PairKeys::instance().get(*me, f.token.peer_public_key);
    const bool holds = key && (poly ? poly_tag_holds(key->poly, data, signed_bytes, data + signed_bytes)
                                    : sodium_memcmp(pair_tag(key->blake2b, data, signed_bytes).data(),
                                                    data + signed_bytes, kFrameTagBytes) == 0);
    if (!holds) return std::string("bad frame MAC");
  } else {
    const bool vouched = carrier != PublicKey{} && carrier == f.token.peer_public_key;
    if (!vouched &&
        crypto_sign_verify_detached(data + signed_bytes, data, signed_bytes, f.token.peer_public_key.data()) != 0)
      return std::string("bad frame signature");
  }
  return f;
}

std::variant<Opened, std::string> open_as_its_run(const uint8_t* data, size_t size, int64_t now_unix,
                                                  const PeerIdentity* me) {
  if (data == nullptr || size < kFrameOverheadBytes) return open(data, size, PublicKey{}, now_unix);
  return open(data, size, get<32>(data + sizeof kFrameMagic), now_unix, me);
}

// --- Replay ----------------------------------------------------------------------------------------------

ReplayGuard::ReplayGuard(std::chrono::nanoseconds window) : window_ns_(static_cast<uint64_t>(window.count())) {
  if (window.count() <= 0)
    throw ConfigError("replay window must be positive, got " + std::to_string(window.count()) + " ns",
                      "use a window of a few minutes, longer than the clock skew between peers");
}

std::string ReplayGuard::admit(const PublicKey& sender, const PublicKey& receiver_field,
                               const PublicKey& our_public_key, uint64_t counter, uint64_t now_ns) {
  static const PublicKey kBroadcast{};
  if (receiver_field != our_public_key && receiver_field != kBroadcast) return "addressed to another peer";
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = highest_.find(sender);
  if (it != highest_.end() && counter <= it->second) return "replayed frame";
  // Both directions: a counter far in the future would otherwise raise the sender's high-water mark and lock
  // out its honest frames until our clock caught up.
  uint64_t distance = counter > now_ns ? counter - now_ns : now_ns - counter;
  if (distance > window_ns_) return "stale frame";
  if (it == highest_.end()) {
    highest_.emplace(sender, counter);
  } else {
    it->second = counter;
  }
  forget_stale_senders(now_ns);
  return {};
}

// A sender whose highest counter is older than the window can be forgotten: any frame of theirs we might see
// again has a counter no higher, so the stale check refuses it without the entry. This bounds the map by the
// peers heard from within one window.
void ReplayGuard::forget_stale_senders(uint64_t now_ns) {
  if (now_ns >= last_prune_ns_ && now_ns - last_prune_ns_ < window_ns_) return;  // at most once per window
  last_prune_ns_ = now_ns;
  for (auto it = highest_.begin(); it != highest_.end();) {
    bool gone = it->second < now_ns && now_ns - it->second > window_ns_;
    it = gone ? highest_.erase(it) : std::next(it);
  }
}

uint64_t next_counter() {
  static std::atomic<uint64_t> last{0};
  auto now = std::chrono::system_clock::now().time_since_epoch();
  uint64_t wall = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(now).count());
  uint64_t prev = last.load(std::memory_order_relaxed);
  uint64_t next;
  do {
    next = std::max(wall, prev + 1);
  } while (!last.compare_exchange_weak(prev, next, std::memory_order_relaxed));
  return next;
}

}  // namespace cohort::p2p

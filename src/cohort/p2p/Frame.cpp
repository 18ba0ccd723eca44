// The swarm's frame: its layout, how it is sealed (an Ed25519 signature, or a MAC for one peer) and opened,
// and the replay guard that decides whether an opened frame may be acted on. The keys and tokens a frame
// carries are p2p/Auth.cpp's; the declarations of both are in p2p/Auth.h.
#include <sodium.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <utility>

#include "cohort/p2p/Auth.h"
#include "cohort/p2p/Wire.h"
#include "cohort/util/Error.h"

namespace cohort::p2p {

using detail::ensure_sodium;

namespace {

constexpr uint8_t kFrameMagic[4] = {'C', 'S', 'W', '1'};      // signed: Ed25519 over the frame
constexpr uint8_t kPairFrameMagic[4] = {'C', 'S', 'W', '2'};  // for one peer: keyed BLAKE2b under the pair's key
constexpr uint8_t kPolyFrameMagic[4] = {'C', 'S', 'W', '3'};  // for one peer: a Poly1305 tag under the pair's key
bool has_magic(const uint8_t* frame, const uint8_t (&magic)[4]) { return std::memcmp(frame, magic, 4) == 0; }

// The header's layout is write_header's and read_header's alone, so the two cannot disagree.
// Writes the frame's header (magic, token, receiver, counter, length) into the room at the front of
// `frame`, which holds kFrameHeaderBytes of it followed by the payload.
void write_header(const uint8_t (&magic)[4], const PeerIdentity& me, const PublicKey& receiver_public_key,
                  uint64_t counter, std::vector<uint8_t>& frame) {
  COHORT_ASSERT(frame.size() >= kFrameHeaderBytes, "a frame to seal in place starts with room for its header");
  const Token& t = me.token;
  Writer w;
  w.out().reserve(kFrameHeaderBytes);
  w.raw(magic, sizeof magic).raw(t.run_public_key.data(), 32).raw(t.peer_public_key.data(), 32).i64(t.expires_unix);
  w.raw(t.signature.data(), 64).raw(receiver_public_key.data(), 32).u64(counter).u64(frame.size() - kFrameHeaderBytes);
  COHORT_ASSERT(w.out().size() == kFrameHeaderBytes, "write_header writes kFrameHeaderBytes");
  std::memcpy(frame.data(), w.out().data(), kFrameHeaderBytes);
}

// Reads what a header says, unverified, into `f` (its sender's token, the receiver and the counter), and
// returns the payload length it claims. `frame` holds at least kFrameHeaderBytes.
uint64_t read_header(const uint8_t* frame, Opened& f) {
  Reader r(frame + sizeof kFrameMagic, kFrameHeaderBytes - sizeof kFrameMagic);
  r.raw(f.token.run_public_key.data(), 32);
  r.raw(f.token.peer_public_key.data(), 32);
  f.token.expires_unix = r.i64();
  r.raw(f.token.signature.data(), 64);
  r.raw(f.receiver.data(), 32);
  f.counter = r.u64();
  return r.u64();
}

void append(std::vector<uint8_t>& frame, const Signature& tag) { frame.insert(frame.end(), tag.begin(), tag.end()); }

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

std::string claimed_sender(const uint8_t* frame, size_t size) {
  constexpr size_t kPeerKeyAt = 4 + 32;  // after the magic and the token's run key
  if (frame == nullptr || size < kPeerKeyAt + 32) return "unknown";
  return hex(frame + kPeerKeyAt, 4);
}

std::optional<Claimed> claimed_header(const uint8_t* frame, size_t size) {
  if (frame == nullptr || size < kFrameHeaderBytes ||
      !(has_magic(frame, kFrameMagic) || has_magic(frame, kPairFrameMagic) || has_magic(frame, kPolyFrameMagic)))
    return std::nullopt;
  Opened f;
  read_header(frame, f);
  return Claimed{f.token.peer_public_key, f.counter};
}

void seal_in_place(const PeerIdentity& me, const PublicKey& receiver_public_key, uint64_t counter,
                   std::vector<uint8_t>& frame) {
  ensure_sodium();
  write_header(kFrameMagic, me, receiver_public_key, counter, frame);
  Signature sig;
  crypto_sign_detached(sig.data(), nullptr, frame.data(), frame.size(), me.peer_secret_key.data());
  append(frame, sig);
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
    append(frame, poly_tag(key->poly, frame.data(), frame.size()));
  } else {
    write_header(kPairFrameMagic, me, receiver_public_key, counter, frame);
    append(frame, pair_tag(key->blake2b, frame.data(), frame.size()));
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
  Opened f;
  const uint64_t length = read_header(data, f);
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
  Opened claimed;
  read_header(data, claimed);
  return open(data, size, claimed.token.run_public_key, now_unix, me);
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

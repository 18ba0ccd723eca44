// Who may join a swarm, and proof that each frame came from a peer that may.
//
// A run key (Ed25519) belongs to whoever starts the run. It signs tokens: each token binds a fresh peer key to
// the run until an expiry time. Every frame a peer sends carries its token and is signed with the peer key, so a
// receiver that knows only the run's public key can check both who sent a frame and that the run admitted them.
// A ReplayGuard then refuses frames seen before, frames for another peer, and frames far from the current time.
// All cryptography is libsodium's. Keys and tokens are defined in p2p/Auth.cpp, frames and the replay guard
// in p2p/Frame.cpp.
//
//   RunKey run = generate_run_key();                       // cohort swarm keygen --out run.key
//   save_run_key(run, "run.key");
//   PeerIdentity me = issue_token(run, parse_ttl("24h"), unix_now);
//   std::vector<uint8_t> frame = seal(me, receiver_public_key, next_counter(), payload);
//   ...
//   auto opened = open(frame.data(), frame.size(), run.public_key, unix_now);
//   if (auto* reason = std::get_if<std::string>(&opened)) drop(*reason);
//   const Opened& f = std::get<Opened>(opened);
//   std::string refused = guard.admit(f.token.peer_public_key, f.receiver, me.token.peer_public_key, f.counter,
//                                     now_ns);
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace cohort::p2p {

using PublicKey = std::array<uint8_t, 32>;
using SecretKey = std::array<uint8_t, 64>;  // libsodium's form: 32-byte seed followed by the public key
using Signature = std::array<uint8_t, 64>;

// The key that admits peers to one run. Keep the file private: anyone holding it can issue tokens.
struct RunKey {
  PublicKey public_key{};
  SecretKey secret_key{};
};

RunKey generate_run_key();
// Writes {"format":"cohort-swarm-run-key","version":1,"public_key":hex,"secret_key":hex} with mode 0600.
void save_run_key(const RunKey& key, const std::filesystem::path& path);
// Throws cohort::ConfigError naming the path when the file is missing, malformed, of another format or version,
// or when its secret key does not match its public key.
RunKey load_run_key(const std::filesystem::path& path);
// A run key that every cohort build derives from the same published seed, for swarm.insecure: peers on a network
// the user trusts can join without key files. It authenticates nothing, since anyone can issue its tokens.
RunKey insecure_run_key();

// The run key's permission for one peer key, until `expires_unix` (seconds since the Unix epoch, UTC).
// `signature` is the run key's Ed25519 signature over
//   "cohort-swarm-token-v1" || run_public_key || peer_public_key || expires_unix (8 bytes, little-endian).
struct Token {
  PublicKey run_public_key{};
  PublicKey peer_public_key{};
  int64_t expires_unix = 0;
  Signature signature{};
};

// A token together with the peer secret key it names: everything one peer needs to join the run.
struct PeerIdentity {
  Token token;
  SecretKey peer_secret_key{};
};

// Makes a fresh peer keypair and signs a token for it that expires `ttl` after `now_unix`.
// Throws cohort::ConfigError when ttl is not positive or the expiry would overflow.
PeerIdentity issue_token(const RunKey& run, std::chrono::seconds ttl, int64_t now_unix);
// Writes {"format":"cohort-swarm-token","version":1,"run_public_key","peer_public_key","expires_unix",
// "signature","peer_secret_key"} with mode 0600.
void save_identity(const PeerIdentity& identity, const std::filesystem::path& path);
// Throws cohort::ConfigError naming the path when the file is missing, malformed, of another format or version,
// when the token's signature does not verify, or when the secret key is not the token's peer key. An expired
// token loads: whether it is still good is check_token's decision, at the time of use.
PeerIdentity load_identity(const std::filesystem::path& path);

// "90s", "15m", "24h", "7d": a positive whole number and one unit. Throws cohort::ConfigError otherwise.
std::chrono::seconds parse_ttl(const std::string& text);

// "" when the token was signed by `our_run_public_key` and is unexpired at `now_unix`; else the reason:
// "signed by another run key", "bad signature", "expired at 2024-05-01T12:00:00Z".
std::string check_token(const Token& token, const PublicKey& our_run_public_key, int64_t now_unix);
// check_token's reason for a token another run key signed (open() says "token refused: " before it).
inline constexpr const char* kTokenOfAnotherRun = "signed by another run key";

// The first 8 hex characters of a peer key: a short printable peer id for logs.
std::string peer_name(const PublicKey& peer_public_key);
// Lower-case hex of `size` bytes.
std::string hex(const uint8_t* data, size_t size);

// The peer a frame claims to come from (peer_name of its token's peer key), for naming a frame that
// open() refused in the log; "unknown" when the frame is too short to say. Not a verified identity.
std::string claimed_sender(const uint8_t* frame, size_t size);

// What a frame claims in its header, unverified: its sender's peer key and its counter. For dropping a frame
// that could not be newer than one already taken from that sender before paying for its signatures, never
// for acting on it. Nothing when the frame is too short to say.
struct Claimed {
  PublicKey peer{};
  uint64_t counter = 0;
};
std::optional<Claimed> claimed_header(const uint8_t* frame, size_t size);

// Frame layout, all integers little-endian:
//   "CSW1" | token (32 + 32 + 8 + 64) | receiver (32) | counter (8) | payload length (8) | payload | signature (64)
// The signature is the sender's peer key over every byte before it. A frame for one peer (seal_for) is
// "CSW3" (or the previous release's "CSW2") and the same layout, with a MAC under the key the two peers
// share in the signature's 64 bytes (Note [A frame for one peer carries a MAC, not a signature] in
// p2p/Frame.cpp).
inline constexpr size_t kFrameHeaderBytes = 4 + 136 + 32 + 8 + 8;
inline constexpr size_t kFrameTagBytes = 64;
inline constexpr size_t kFrameOverheadBytes = kFrameHeaderBytes + kFrameTagBytes;

// Seals `payload` for `receiver_public_key` (a peer key; all zero for a record meant for every peer).
// `counter` should come from next_counter(): receivers refuse counters that do not increase or that are far
// from their clock (see ReplayGuard).
std::vector<uint8_t> seal(const PeerIdentity& me, const PublicKey& receiver_public_key, uint64_t counter,
                          const std::vector<uint8_t>& payload);
// How a frame for one peer is authenticated: a Poly1305 tag ("CSW3", about six times faster to compute
// and check than the previous release's MAC), or keyed BLAKE2b ("CSW2"), for a peer of that release
// (Note [A frame for one peer carries a Poly1305 tag] in p2p/Frame.cpp). A peer's record says which it reads.
enum class PairMac { kPoly1305, kBlake2b };
// The same as seal for one peer, which alone can open it, with a MAC in place of the signature: a hash of
// the frame rather than elliptic-curve work, once the pair's key is known. Signed (seal) when the receiver
// is all zero or not a valid key.
std::vector<uint8_t> seal_for(const PeerIdentity& me, const PublicKey& receiver_public_key, uint64_t counter,
                              const std::vector<uint8_t>& payload, PairMac mac = PairMac::kPoly1305);

// The same, sealed where the payload already lies, for a sender that writes it straight after room for
// the header and so saves a copy of it (p2p::Transport::send): `frame` holds kFrameHeaderBytes of any
// value, then the payload; the header is written into that room and the signature or MAC appended.
// seal_for_in_place says whether it used a MAC (false: signed, as seal_for falls back to).
void seal_in_place(const PeerIdentity& me, const PublicKey& receiver_public_key, uint64_t counter,
                   std::vector<uint8_t>& frame);
bool seal_for_in_place(const PeerIdentity& me, const PublicKey& receiver_public_key, uint64_t counter,
                       std::vector<uint8_t>& frame, PairMac mac = PairMac::kPoly1305);

struct Opened {
  Token token;  // the sender's; token.peer_public_key identifies the sender
  PublicKey receiver{};
  uint64_t counter = 0;
  std::vector<uint8_t> payload;
};

// Checks a frame's layout, its token (check_token) and its signature, or, for a frame sealed for one peer,
// its MAC: that needs the receiver's identity `me`, and a MAC frame for another peer is refused. Returns the
// reason on any failure; never throws on bad input and never reads outside [data, data + size). Does not
// check replay or the receiver of a signed frame: pass the result to a ReplayGuard.
std::variant<Opened, std::string> open(const uint8_t* data, size_t size, const PublicKey& our_run_public_key,
                                       int64_t now_unix, const PeerIdentity* me = nullptr);
// The same for a frame carried inside a frame of `carrier` that open() verified (a record in a kRecord
// frame): when the inner frame is the carrier's own (its token names the carrier), the outer signature
// already covers its bytes and its own signature is not checked again; the token still is. Anything else
// is checked in full, as open() does.
std::variant<Opened, std::string> open_carried(const uint8_t* data, size_t size, const PublicKey& our_run_public_key,
                                               int64_t now_unix, const PublicKey& carrier,
                                               const PeerIdentity* me = nullptr);
// The same checks without the copy of the payload, which stays where it lies in the frame: its bytes
// [kFrameHeaderBytes, size - kFrameTagBytes). Opened::payload is left empty. For a receiver that copies
// the payload on to where it goes (p2p::Transport, an averaging part of megabytes).
std::variant<Opened, std::string> open_in_place(const uint8_t* data, size_t size, const PublicKey& our_run_public_key,
                                                int64_t now_unix, const PeerIdentity* me = nullptr,
                                                const PublicKey& carrier = PublicKey{});
// The same, checked against the run key the frame's own token names: it proves only that a holder of a
// token of *some* run sealed it. For telling a peer of another run why it is refused (Note [A peer of
// another run is told so] in p2p/DirectoryIdentity.cpp), never for acting on what the frame says.
std::variant<Opened, std::string> open_as_its_run(const uint8_t* data, size_t size, int64_t now_unix,
                                                  const PeerIdentity* me = nullptr);

// Refuses frames that a valid peer sent but that must not be acted on: addressed to another peer, already seen
// (or older than one already seen from the same sender), or with a counter too far from our clock. Thread-safe.
class ReplayGuard {
 public:
  explicit ReplayGuard(std::chrono::nanoseconds window = std::chrono::seconds(120));

  // "" and records the counter when the frame may be acted on; else "addressed to another peer",
  // "replayed frame" or "stale frame". `receiver_field` may be `our_public_key` or all zero (broadcast).
  std::string admit(const PublicKey& sender, const PublicKey& receiver_field, const PublicKey& our_public_key,
                    uint64_t counter, uint64_t now_ns);

 private:
  void forget_stale_senders(uint64_t now_ns);

  const uint64_t window_ns_;
  std::mutex mutex_;
  std::map<PublicKey, uint64_t> highest_;  // per sender, the highest counter admitted
  uint64_t last_prune_ns_ = 0;
};

// Wall-clock nanoseconds since the Unix epoch, strictly increasing across calls in this process (even when the
// clock steps back or two threads ask in the same nanosecond), so that no two frames a peer seals share one.
uint64_t next_counter();

namespace detail {
// Initialises libsodium once, thread-safely, before p2p's first call into it; throws cohort::Error when it cannot.
void ensure_sodium();
}  // namespace detail

}  // namespace cohort::p2p

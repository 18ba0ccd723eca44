#include "cohort/p2p/Auth.h"

#include <sodium.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iterator>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <system_error>
#include <tuple>

#include "cohort/p2p/Wire.h"
#include "cohort/util/AtomicFile.h"
#include "cohort/util/Error.h"

namespace cohort::p2p {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;  // ordered so that saved files list format and version first

static_assert(crypto_sign_PUBLICKEYBYTES == 32 && crypto_sign_SECRETKEYBYTES == 64 && crypto_sign_BYTES == 64,
              "Auth.h sizes its keys for libsodium's Ed25519");

// libsodium must be initialised once before any other call; a function-local static makes that thread-safe.
void detail::ensure_sodium() {
  static const bool ok = sodium_init() >= 0;  // 1 means another library already initialised it: fine
  if (!ok) throw Error("libsodium failed to initialise", "check that the system has a working /dev/urandom");
}
using detail::ensure_sodium;

namespace {

constexpr char kRunKeyFormat[] = "cohort-swarm-run-key";
constexpr char kTokenFormat[] = "cohort-swarm-token";
constexpr int kFormatVersion = 1;
constexpr char kRunKeyHint[] = "create one with: cohort swarm keygen --out run.key";
constexpr char kTokenHint[] = "issue one with: cohort swarm token --key run.key --ttl 24h --out peer.token";
// Domain separation: a run key signs only this string followed by fixed-size fields, so no other message it
// might ever sign can be mistaken for a token.
constexpr char kTokenDomain[] = "cohort-swarm-token-v1";
std::vector<uint8_t> token_message(const PublicKey& run_pk, const PublicKey& peer_pk, int64_t expires_unix) {
  Writer w;
  w.raw(kTokenDomain, std::strlen(kTokenDomain)).raw(run_pk.data(), run_pk.size()).raw(peer_pk.data(), peer_pk.size());
  return w.i64(expires_unix).take();
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

}  // namespace cohort::p2p

#include "cohort/store/StoreProtocol.h"

#include <algorithm>
#include <cstring>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

namespace cohort::store {

// Note [Store handshake]
// c10d's TCPStore acts on whatever any process that reaches its port sends (pytorch#173909): a stranger
// can read the Gloo addresses, overwrite keys or stall the job. Ours first proves that both ends hold
// the job's secret without sending it:
//   server -> client  HELLO  "COHS", version, server nonce (32 random bytes)
//   client -> server  AUTH   "COHA", client nonce, HMAC(secret, "client" | server nonce | client nonce)
//   server -> client  OK     "COHK", HMAC(secret, "server" | server nonce | client nonce)
//                  or REFUSED "COHF", reason  (and the server closes the connection)
// Until AUTH checks out the server accepts one frame of at most kMaxHandshakeFrameBytes and acts on
// nothing; the fresh server nonce makes a recorded AUTH useless on another connection, and the server's
// proof tells the client it reached the job's store, not an impostor on the port.

namespace {

constexpr char kHello[] = "COHS";
constexpr char kAuth[] = "COHA";
constexpr char kAuthOk[] = "COHK";
constexpr char kAuthRefused[] = "COHF";

class Writer {
 public:
  void u8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
  void i64(int64_t v) {
    const auto u = static_cast<uint64_t>(v);
    for (int i = 0; i < 8; ++i) out_.push_back(static_cast<char>((u >> (8 * i)) & 0xff));
  }
  void raw(const void* p, size_t n) { out_.append(static_cast<const char*>(p), n); }
  void str(std::string_view s) {
    u32(static_cast<uint32_t>(s.size()));
    raw(s.data(), s.size());
  }
  void bytes(const Bytes& b) {
    u32(static_cast<uint32_t>(b.size()));
    raw(b.data(), b.size());
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

class Reader {
 public:
  Reader(std::string_view in, const char* what) : in_(in), what_(what) {}
  uint8_t u8() { return static_cast<uint8_t>(take(1)[0]); }
  uint32_t u32() {
    const auto s = take(4);
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<uint8_t>(s[i])) << (8 * i);
    return v;
  }
  int64_t i64() {
    const auto s = take(8);
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(s[i])) << (8 * i);
    return static_cast<int64_t>(v);
  }
  std::string key() {
    const uint32_t n = u32();
    if (n > kMaxKeyBytes)
      fail("a key of " + std::to_string(n) + " bytes (the limit is " + std::to_string(kMaxKeyBytes) + ")");
    return std::string(take(n));
  }
  Bytes bytes() {
    const uint32_t n = u32();
    const auto s = take(n);  // checks n against what is left before anything is allocated
    return Bytes(s.begin(), s.end());
  }
  std::string_view take(size_t n) {
    if (n > in_.size() - pos_)
      fail("a field of " + std::to_string(n) + " bytes where only " + std::to_string(in_.size() - pos_) + " remain");
    const auto s = in_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  void magic(const char* m) {
    if (take(4) != std::string_view(m, 4)) fail("a message that does not start with " + std::string(m));
  }
  void end() {
    if (pos_ != in_.size()) fail(std::to_string(in_.size() - pos_) + " bytes after the end of the message");
  }
  [[noreturn]] void fail(const std::string& why) const {
    throw ProtocolError(std::string("malformed ") + what_ + ": " + why,
                        "only cohort processes of the same version should connect to the rendezvous store");
  }

 private:
  std::string_view in_;
  size_t pos_ = 0;
  const char* what_;
};

template <size_t N>
std::array<uint8_t, N> fixed(Reader& r) {
  const auto s = r.take(N);
  std::array<uint8_t, N> a{};
  std::memcpy(a.data(), s.data(), N);
  return a;
}

Mac proof(std::string_view role, std::string_view secret, const Nonce& server_nonce, const Nonce& client_nonce) {
  std::string msg = "cohort-store-v1 ";
  msg += role;
  msg.append(reinterpret_cast<const char*>(server_nonce.data()), server_nonce.size());
  msg.append(reinterpret_cast<const char*>(client_nonce.data()), client_nonce.size());
  Mac mac{};
  unsigned int len = 0;
  // HMAC with an empty key is well defined (the key is zero-padded); it is what a loopback job without a
  // secret uses.
  static const unsigned char kEmpty = 0;
  const auto* key = secret.empty() ? &kEmpty : reinterpret_cast<const unsigned char*>(secret.data());
  if (!HMAC(EVP_sha256(), key, static_cast<int>(secret.size()), reinterpret_cast<const unsigned char*>(msg.data()),
            msg.size(), mac.data(), &len) ||
      len != kMacBytes)
    throw CommError("HMAC-SHA256 failed in OpenSSL", "check the OpenSSL installation");
  return mac;
}

}  // namespace

const char* op_name(Op op) {
  switch (op) {
    case Op::kSet: return "set";
    case Op::kGet: return "get";
    case Op::kAdd: return "add";
    case Op::kCompareSet: return "compare_set";
    case Op::kDelete: return "delete";
    case Op::kCheck: return "check";
    case Op::kNumKeys: return "num_keys";
    case Op::kWait: return "wait";
  }
  return "?";
}

std::string encode_request(const Request& r) {
  Writer w;
  w.u8(static_cast<uint8_t>(r.op));
  switch (r.op) {
    case Op::kSet:
      w.str(r.keys.at(0));
      w.bytes(r.values.at(0));
      break;
    case Op::kGet:
    case Op::kDelete: w.str(r.keys.at(0)); break;
    case Op::kAdd:
      w.str(r.keys.at(0));
      w.i64(r.number);
      break;
    case Op::kCompareSet:
      w.str(r.keys.at(0));
      w.bytes(r.values.at(0));
      w.bytes(r.values.at(1));
      break;
    case Op::kWait: w.i64(r.number); [[fallthrough]];
    case Op::kCheck:
      w.u32(static_cast<uint32_t>(r.keys.size()));
      for (const auto& k : r.keys) w.str(k);
      break;
    case Op::kNumKeys: break;
  }
  return w.take();
}

Request decode_request(std::string_view payload) {
  Reader in(payload, "store request");
  Request r;
  const uint8_t op = in.u8();
  if (op < static_cast<uint8_t>(Op::kSet) || op > static_cast<uint8_t>(Op::kWait))
    in.fail("unknown operation " + std::to_string(op));
  r.op = static_cast<Op>(op);
  switch (r.op) {
    case Op::kSet:
      r.keys.push_back(in.key());
      r.values.push_back(in.bytes());
      break;
    case Op::kGet:
    case Op::kDelete: r.keys.push_back(in.key()); break;
    case Op::kAdd:
      r.keys.push_back(in.key());
      r.number = in.i64();
      break;
    case Op::kCompareSet:
      r.keys.push_back(in.key());
      r.values.push_back(in.bytes());
      r.values.push_back(in.bytes());
      break;
    case Op::kWait:
      r.number = in.i64();
      if (r.number < 0) in.fail("a negative wait timeout " + std::to_string(r.number));
      [[fallthrough]];
    case Op::kCheck: {
      const uint32_t n = in.u32();
      if (n == 0 || n > kMaxKeys) in.fail(std::to_string(n) + " keys (1 to " + std::to_string(kMaxKeys) + " allowed)");
      for (uint32_t i = 0; i < n; ++i) r.keys.push_back(in.key());
      break;
    }
    case Op::kNumKeys: break;
  }
  in.end();
  return r;
}

std::string encode_response(const Response& r) {
  Writer w;
  w.u8(static_cast<uint8_t>(r.status));
  w.i64(r.number);
  w.bytes(r.value);
  return w.take();
}

Response decode_response(std::string_view payload) {
  Reader in(payload, "store response");
  Response r;
  const uint8_t s = in.u8();
  if (s > static_cast<uint8_t>(Status::kTimeout)) in.fail("unknown status " + std::to_string(s));
  r.status = static_cast<Status>(s);
  r.number = in.i64();
  r.value = in.bytes();
  in.end();
  return r;
}

std::string frame(std::string_view payload) {
  Writer w;
  w.u32(static_cast<uint32_t>(payload.size()));
  w.raw(payload.data(), payload.size());
  return w.take();
}

std::optional<FrameView> next_frame(std::string_view buffer, uint32_t max_payload) {
  if (buffer.size() < 4) return std::nullopt;
  Reader in(buffer.substr(0, 4), "frame");
  const uint32_t n = in.u32();
  if (n > max_payload)
    throw ProtocolError("a frame of " + std::to_string(n) + " bytes, over the limit of " + std::to_string(max_payload),
                        "only cohort processes should connect to the rendezvous store");
  if (buffer.size() - 4 < n) return std::nullopt;
  return FrameView{buffer.substr(4, n), 4 + static_cast<size_t>(n)};
}

std::string encode_hello(const Nonce& server_nonce) {
  Writer w;
  w.raw(kHello, 4);
  w.u8(kProtocolVersion);
  w.raw(server_nonce.data(), server_nonce.size());
  return w.take();
}

Nonce decode_hello(std::string_view payload) {
  Reader in(payload, "store greeting");
  in.magic(kHello);
  const uint8_t v = in.u8();
  if (v != kProtocolVersion)
    throw ProtocolError("the rendezvous store speaks protocol version " + std::to_string(v) + ", this cohort speaks " +
                            std::to_string(kProtocolVersion),
                        "run the same cohort version on every machine");
  auto nonce = fixed<kNonceBytes>(in);
  in.end();
  return nonce;
}

std::string encode_auth(const Nonce& client_nonce, const Mac& mac) {
  Writer w;
  w.raw(kAuth, 4);
  w.raw(client_nonce.data(), client_nonce.size());
  w.raw(mac.data(), mac.size());
  return w.take();
}

std::pair<Nonce, Mac> decode_auth(std::string_view payload) {
  Reader in(payload, "store handshake");
  in.magic(kAuth);
  auto nonce = fixed<kNonceBytes>(in);
  auto mac = fixed<kMacBytes>(in);
  in.end();
  return {nonce, mac};
}

std::string encode_auth_ok(const Mac& mac) {
  Writer w;
  w.raw(kAuthOk, 4);
  w.raw(mac.data(), mac.size());
  return w.take();
}

std::string encode_auth_refused(std::string_view reason) {
  Writer w;
  w.raw(kAuthRefused, 4);
  w.raw(reason.data(), std::min<size_t>(reason.size(), 200));
  return w.take();
}

Mac decode_auth_reply(std::string_view payload) {
  if (payload.substr(0, 4) == std::string_view(kAuthRefused, 4))
    throw CommError("the rendezvous store refused this process: " + std::string(payload.substr(4)),
                    "the reason above says what to change; a refused proof means another secret: give every "
                    "process the same COHORT_TOKEN, or --token-file with the same file");
  Reader in(payload, "store handshake reply");
  in.magic(kAuthOk);
  auto mac = fixed<kMacBytes>(in);
  in.end();
  return mac;
}

Mac client_proof(std::string_view secret, const Nonce& server_nonce, const Nonce& client_nonce) {
  return proof("client", secret, server_nonce, client_nonce);
}

Mac server_proof(std::string_view secret, const Nonce& server_nonce, const Nonce& client_nonce) {
  return proof("server", secret, server_nonce, client_nonce);
}

bool equal_macs(const Mac& a, const Mac& b) { return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0; }

Nonce random_nonce() {
  Nonce n{};
  if (RAND_bytes(n.data(), static_cast<int>(n.size())) != 1)
    throw CommError("no random bytes from OpenSSL for the store handshake", "check /dev/urandom");
  return n;
}

}  // namespace cohort::store

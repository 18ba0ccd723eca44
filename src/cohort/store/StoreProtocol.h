// The rendezvous store's wire protocol: length-prefixed binary frames, an HMAC-SHA256 challenge-response
// handshake, and the decoder the server runs on every frame a peer sends it.
//
//   std::string wire = store::frame(store::encode_request({store::Op::kSet, {"key"}, {{1, 2}}}));
//   store::Request r = store::decode_request(payload);   // throws store::ProtocolError on bad input
//
// Free of sockets so that the decoder is unit-tested and fuzzed. Every number is little-endian. A frame
// is a u32 payload length and the payload. See Note [Store handshake] in StoreProtocol.cpp.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cohort/util/Error.h"

namespace cohort::store {

// A value in our store is a Gloo address, a config or a counter: kilobytes. The cap bounds what one
// peer can make the server buffer.
inline constexpr uint32_t kMaxFrameBytes = 16u << 20;
// Before a peer has proved it knows the secret it may send one small frame, the proof.
inline constexpr uint32_t kMaxHandshakeFrameBytes = 256;
inline constexpr size_t kMaxKeys = 4096;
inline constexpr size_t kMaxKeyBytes = 4096;
inline constexpr size_t kNonceBytes = 32;
inline constexpr size_t kMacBytes = 32;
inline constexpr uint8_t kProtocolVersion = 1;

using Bytes = std::vector<uint8_t>;
using Nonce = std::array<uint8_t, kNonceBytes>;
using Mac = std::array<uint8_t, kMacBytes>;

// A frame that breaks the protocol: the server closes the connection that sent it.
class ProtocolError : public CommError {
  using CommError::CommError;
};

enum class Op : uint8_t {
  kSet = 1,         // key, value
  kGet = 2,         // key -> value or kNotFound (never blocks: the client waits first)
  kAdd = 3,         // key, number -> the new number
  kCompareSet = 4,  // key, expected, desired -> the value now stored (c10d's compareSet)
  kDelete = 5,      // key -> number 1 if it existed
  kCheck = 6,       // keys -> number 1 if all exist
  kNumKeys = 7,     // -> number
  kWait = 8,        // keys, number = timeout in ms -> kOk once all exist, or kTimeout
};
const char* op_name(Op op);

struct Request {
  Op op = Op::kGet;
  std::vector<std::string> keys;
  std::vector<Bytes> values;
  int64_t number = 0;
};

enum class Status : uint8_t { kOk = 0, kNotFound = 1, kTimeout = 2 };

struct Response {
  Status status = Status::kOk;
  int64_t number = 0;
  Bytes value;
};

// Payload codecs. decode_* throw ProtocolError naming what was wrong; they never read past `payload`
// and never allocate more than `payload` holds.
std::string encode_request(const Request& r);
Request decode_request(std::string_view payload);
std::string encode_response(const Response& r);
Response decode_response(std::string_view payload);

// A u32 length prefix, then the payload.
std::string frame(std::string_view payload);
// The first complete frame's payload in `buffer` and how many bytes it took, or nullopt when more bytes
// are needed. Throws ProtocolError when the declared length exceeds `max_payload`, before anything
// more is read.
struct FrameView {
  std::string_view payload;
  size_t consumed = 0;
};
std::optional<FrameView> next_frame(std::string_view buffer, uint32_t max_payload);

// Handshake messages (payloads).
std::string encode_hello(const Nonce& server_nonce);
Nonce decode_hello(std::string_view payload);
std::string encode_auth(const Nonce& client_nonce, const Mac& proof);
std::pair<Nonce, Mac> decode_auth(std::string_view payload);
// The server's answer: its own proof, or a refusal with a reason.
std::string encode_auth_ok(const Mac& proof);
std::string encode_auth_refused(std::string_view reason);
// Returns the server's proof; throws CommError carrying the server's reason on a refusal.
Mac decode_auth_reply(std::string_view payload);

// HMAC-SHA256 over both nonces, with the role in the message so that one side's proof can never be
// replayed as the other's.
Mac client_proof(std::string_view secret, const Nonce& server_nonce, const Nonce& client_nonce);
Mac server_proof(std::string_view secret, const Nonce& server_nonce, const Nonce& client_nonce);
bool equal_macs(const Mac& a, const Mac& b);  // constant time
Nonce random_nonce();

}  // namespace cohort::store

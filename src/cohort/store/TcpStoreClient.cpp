#include "cohort/store/TcpStoreClient.h"

#include <cstring>
#include <stdexcept>

#include "cohort/store/Socket.h"
#include "cohort/util/Error.h"

// Note [c10d's two store protocols]
// c10d's TCPStore (the store torchrun's agent hosts) has spoken two protocols. Both send a query code
// byte, then strings and byte vectors as a u64 length and the bytes, numbers as i64, all little-endian;
// replies are the same in both. They differ in two ways:
// - The codes. LibTorch 1.13: SET 0, COMPARE_SET 1, GET 2, ADD 3, CHECK 4, WAIT 5, GETNUMKEYS 6,
//   WATCH_KEY 7, DELETE_KEY 8. LibTorch 2.x (checked against 2.14.1; the change came with
//   pytorch#107607): VALIDATE 0, SET 1, COMPARE_SET 2, GET 3, ADD 4, CHECK 5, WAIT 6, GETNUMKEYS 7,
//   DELETE_KEY 8, then APPEND, MULTI_GET, MULTI_SET, CANCEL_WAIT, PING and more.
// - The handshake. A 2.x server (libuv's or the classic one) takes a new connection's first query only if
//   it is VALIDATE with the magic number 0x3C85F7CE; libuv's ignores anything else without an answer and
//   without closing. That is why cohort built against 1.13 (whose first query under torchrun was an ADD)
//   waited forever under torch 2.x's torchrun, whatever dist.timeout_s said.
// The generation is found per store by tcpstore::probe() on the first connection: VALIDATE and four
// GETNUMKEYS. A 2.x server answers four numbers. A 1.13 server reads byte 0 as SET and the next eight as
// the key's length (0x070707073C85F7CE, half an exabyte); the allocation fails on every machine (past
// any 64-bit address space's user half), its daemon catches that and closes this one connection, and
// keeps serving the others. Either answer is positive: nothing is decided by a timer, so a loaded
// machine cannot make the probe guess wrong. Silence until the timeout is neither generation, and says so.
// Both generations' clients put "/" before every key on the wire (c10d's keyPrefix_); so does ours, so that
// a key cohort sets is the key a PyTorch client of the same store reads.
// Workers keep torchrun 1.13's per-attempt key prefix ("/worker/attempt_N", Rendezvous.cpp) under both:
// torch 2.x's agent keeps one store across restarts, and a restart must not see the last attempt's keys.

namespace cohort::store {
namespace {

constexpr uint32_t kValidationMagic = 0x3C85F7CE;
// The queries after VALIDATE in the probe: GETNUMKEYS in 2.x, so that their four bytes complete the
// eight-byte length a 1.13 server reads.
constexpr uint8_t kProbeQuery = 7;
// c10d's servers cap a payload at 2 GiB; a length past that is a stream out of step.
// c10d's TCPStore client's prefix before every key (see the Note).
const std::string kKeyPrefix = "/";

std::vector<std::string> on_wire(const std::vector<std::string>& keys) {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& k : keys) out.push_back(kKeyPrefix + k);
  return out;
}

constexpr uint64_t kMaxReplyBytes = uint64_t{2} << 30;
// Socket's reason when a deadline passes (Socket.h).
constexpr const char* kNoReply = "no reply in time";

void put_u64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void put_bytes(std::string& out, const void* data, size_t n) {
  put_u64(out, n);
  out.append(static_cast<const char*>(data), n);
}

int64_t get_i64(const std::string& b) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(b[static_cast<size_t>(i)]);
  return static_cast<int64_t>(v);
}

}  // namespace

const char* protocol_name(TcpStoreProtocol p) {
  return p == TcpStoreProtocol::kLegacy ? "c10d TCPStore, LibTorch 1.13's protocol"
                                        : "c10d TCPStore, LibTorch 2.x's protocol";
}

namespace tcpstore {

const char* query_name(Query q) {
  const char* names[] = {"SET", "COMPARE_SET", "GET", "ADD", "CHECK", "WAIT", "GETNUMKEYS", "DELETE_KEY"};
  return names[static_cast<size_t>(q)];
}

uint8_t query_code(TcpStoreProtocol p, Query q) {
  // See Note [c10d's two store protocols]: 2.x inserted VALIDATE at 0 and dropped WATCH_KEY at 7, so
  // every code up to GETNUMKEYS moved up by one and DELETE_KEY stayed at 8.
  const uint8_t legacy[] = {0, 1, 2, 3, 4, 5, 6, 8};
  const uint8_t validated[] = {1, 2, 3, 4, 5, 6, 7, 8};
  const auto i = static_cast<size_t>(q);
  return p == TcpStoreProtocol::kLegacy ? legacy[i] : validated[i];
}

std::string encode(TcpStoreProtocol p, Query q, const std::vector<std::string>& keys,
                   const std::vector<std::vector<uint8_t>>& values, int64_t number) {
  std::string out(1, static_cast<char>(query_code(p, q)));
  // CHECK and WAIT take a key count; every other query here takes one key or none.
  if (q == Query::kCheck || q == Query::kWait) put_u64(out, keys.size());
  for (const auto& k : keys) put_bytes(out, k.data(), k.size());
  for (const auto& v : values) put_bytes(out, v.data(), v.size());
  if (q == Query::kAdd) put_u64(out, static_cast<uint64_t>(number));
  return out;
}

std::string validate() {
  std::string out(1, '\0');
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((kValidationMagic >> (8 * i)) & 0xff));
  return out;
}

std::string probe() { return validate() + std::string(kProbeQueries, static_cast<char>(kProbeQuery)); }

}  // namespace tcpstore

struct TcpStoreClient::Connection {
  Socket socket;
};

TcpStoreClient::TcpStoreClient(std::string host, uint16_t port, std::chrono::milliseconds timeout, std::string what)
    : c10d::Store(timeout), host_(std::move(host)), port_(port), what_(std::move(what)) {
  auto first = connect(/*validate=*/false);
  protocol_ = detect(*first);
  if (protocol_ == TcpStoreProtocol::kValidated)
    idle_.push_back(std::move(first));  // in step: validated, its four answers read
  else
    idle_.push_back(connect(false));  // the 1.13 server closed the probed one
}

TcpStoreClient::~TcpStoreClient() = default;

std::string TcpStoreClient::where() const { return what_ + " at " + host_ + ":" + std::to_string(port_); }

std::unique_ptr<TcpStoreClient::Connection> TcpStoreClient::connect(bool validate) {
  std::string last_error;
  auto socket = Socket::connect_until(host_, port_, Clock::now() + timeout_, last_error);
  if (!socket)
    throw CommError(
        "cannot reach " + where() + " within " + std::to_string(timeout_.count() / 1000) + " s: " + last_error,
        "check that torchrun's agent is running and that MASTER_ADDR/MASTER_PORT reach it");
  auto c = std::make_unique<Connection>();
  c->socket = std::move(*socket);
  // Under 2.x every connection opens with VALIDATE, which has no answer.
  if (validate) c->socket.send_all(tcpstore::validate(), Clock::now() + timeout_);
  return c;
}

TcpStoreProtocol TcpStoreClient::detect(Connection& c) {
  const auto deadline = Clock::now() + timeout_;
  std::string reply;
  try {
    c.socket.send_all(tcpstore::probe(), deadline);
    reply = c.socket.recv_exact(8 * tcpstore::kProbeQueries, deadline);
  } catch (const PeerClosed&) {
    return TcpStoreProtocol::kLegacy;
  } catch (const std::exception& e) {
    throw CommError(where() +
                        " accepted a connection but did not answer in either protocol of c10d's TCPStore "
                        "within " +
                        std::to_string(timeout_.count() / 1000) + " s (" + e.what() + ")",
                    "under torchrun, MASTER_ADDR/MASTER_PORT must name the agent's store "
                    "(TORCHELASTIC_USE_AGENT_STORE=True); cohort speaks the store of torch 1.13 to 2.14");
  }
  // Four answers to the same question, and a key count no store holds past a billion: anything else is
  // a stranger that happened to send 32 bytes.
  int64_t first = get_i64(reply.substr(0, 8));
  for (int i = 1; i < tcpstore::kProbeQueries; ++i)
    if (get_i64(reply.substr(static_cast<size_t>(8 * i), 8)) != first || first < 0 || first > (int64_t{1} << 30))
      throw CommError(where() + " answered cohort's protocol probe with bytes that are not c10d TCPStore's",
                      "under torchrun, MASTER_ADDR/MASTER_PORT must name the agent's store");
  return TcpStoreProtocol::kValidated;
}

struct TcpStoreClient::Reply {
  Socket& socket;
  Clock::time_point deadline;

  uint8_t u8() { return static_cast<uint8_t>(socket.recv_exact(1, deadline)[0]); }
  int64_t i64() { return get_i64(socket.recv_exact(8, deadline)); }
  std::vector<uint8_t> bytes() {
    const auto n = static_cast<uint64_t>(i64());
    if (n > kMaxReplyBytes) throw std::runtime_error("a reply of " + std::to_string(n) + " bytes: out of step");
    const std::string b = socket.recv_exact(static_cast<size_t>(n), deadline);
    return {b.begin(), b.end()};
  }
};

template <typename Read>
auto TcpStoreClient::call(tcpstore::Query q, const std::string& bytes, std::chrono::milliseconds reply_within,
                          Read read) {
  std::unique_ptr<Connection> c;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!idle_.empty()) {
      c = std::move(idle_.back());
      idle_.pop_back();
    }
  }
  if (!c) c = connect(protocol_ == TcpStoreProtocol::kValidated);
  try {
    Reply reply{c->socket, Clock::now() + reply_within};
    c->socket.send_all(bytes, reply.deadline);
    auto result = read(reply);
    std::lock_guard<std::mutex> lock(mutex_);
    idle_.push_back(std::move(c));
    return result;
  } catch (const std::exception& e) {
    // The connection is dropped, not returned: its reply stream may be out of step now. Dropping it
    // also ends a wait the server still holds for it.
    throw CommError(
        where() + " did not answer a " + tcpstore::query_name(q) + " (" + protocol_name(protocol_) + "): " + e.what(),
        "torchrun's agent hosts this store: if it stopped or restarted the workers, its log says why");
  }
}

void TcpStoreClient::set(const std::string& key, const std::vector<uint8_t>& value) {
  // SET has no answer; the next query's answer on this connection shows it arrived.
  call(tcpstore::Query::kSet, tcpstore::encode(protocol_, tcpstore::Query::kSet, {kKeyPrefix + key}, {value}), timeout_,
       [](Reply&) { return 0; });
}

std::vector<uint8_t> TcpStoreClient::compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                                const std::vector<uint8_t>& desired) {
  const auto q = tcpstore::Query::kCompareSet;
  return call(q, tcpstore::encode(protocol_, q, {kKeyPrefix + key}, {expected, desired}), timeout_,
              [](Reply& r) { return r.bytes(); });
}

std::vector<uint8_t> TcpStoreClient::get(const std::string& key) {
  wait({key});
  const auto q = tcpstore::Query::kGet;
  return call(q, tcpstore::encode(protocol_, q, {kKeyPrefix + key}), timeout_, [](Reply& r) { return r.bytes(); });
}

int64_t TcpStoreClient::add(const std::string& key, int64_t value) {
  const auto q = tcpstore::Query::kAdd;
  return call(q, tcpstore::encode(protocol_, q, {kKeyPrefix + key}, {}, value), timeout_,
              [](Reply& r) { return r.i64(); });
}

bool TcpStoreClient::deleteKey(const std::string& key) {
  const auto q = tcpstore::Query::kDelete;
  return call(q, tcpstore::encode(protocol_, q, {kKeyPrefix + key}), timeout_, [](Reply& r) { return r.i64(); }) != 0;
}

bool TcpStoreClient::check(const std::vector<std::string>& keys) {
  const auto q = tcpstore::Query::kCheck;
  // CheckResponseType: READY 0, NOT_READY 1 in both generations.
  return call(q, tcpstore::encode(protocol_, q, on_wire(keys)), timeout_, [](Reply& r) { return r.u8(); }) == 0;
}

int64_t TcpStoreClient::getNumKeys() {
  const auto q = tcpstore::Query::kNumKeys;
  return call(q, tcpstore::encode(protocol_, q, {}), timeout_, [](Reply& r) { return r.i64(); });
}

void TcpStoreClient::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void TcpStoreClient::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  // c10d's kNoTimeout is 0; a day stands for it, so that no deadline overflows.
  constexpr std::chrono::milliseconds kDay(86'400'000);
  const auto bounded = timeout.count() <= 0 || timeout > kDay ? kDay : timeout;
  const auto q = tcpstore::Query::kWait;
  try {
    // The server answers STOP_WAITING (0) once every key exists, and nothing before: in c10d's protocol
    // the client keeps the deadline.
    call(q, tcpstore::encode(protocol_, q, on_wire(keys)), bounded, [](Reply& r) { return r.u8(); });
  } catch (const CommError& e) {
    if (std::string(e.what()).find(kNoReply) == std::string::npos) throw;  // the store failed, not the peers
    std::string names;
    for (const auto& k : keys) names += (names.empty() ? "" : ", ") + k;
    throw CommError(
        "timed out after " + std::to_string(timeout.count()) + " ms waiting for key(s) " + names + " in " + where(),
        "a rank did not reach the same point: its own error says why");
  }
}

c10::intrusive_ptr<c10d::Store> TcpStoreClient::clone() {
  return c10::make_intrusive<TcpStoreClient>(host_, port_, timeout_, what_);
}

}  // namespace cohort::store

#include "cohort/store/AuthStore.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "cohort/store/Socket.h"
#include "cohort/store/StoreServer.h"
#include "cohort/util/Error.h"

namespace cohort::store {
namespace {

// Past the server's own answer to a wait (it always answers by the deadline), how long a reply may be
// late before the store is declared gone.
constexpr auto kReplySlack = std::chrono::seconds(30);

}  // namespace

struct AuthStore::Connection {
  Socket socket;
  std::string buffer;

  void send_all(const std::string& bytes, Clock::time_point deadline) { socket.send_all(bytes, deadline); }

  // Throws the bare reason; the caller adds the address and the hint.
  std::string recv_frame(Clock::time_point deadline) {
    for (;;) {
      if (auto f = next_frame(buffer, kMaxFrameBytes)) {
        if (f->consumed != buffer.size()) throw std::runtime_error("the store sent more than one reply");
        std::string payload(f->payload);
        buffer.clear();
        return payload;
      }
      socket.recv_some(buffer, deadline);
    }
  }
};

AuthStore::AuthStore(std::string host, uint16_t port, std::string secret, std::chrono::milliseconds timeout)
    : c10d::Store(timeout), host_(std::move(host)), port_(port), secret_(std::move(secret)) {
  // Connect now, so that a wrong address or secret fails at rendezvous, not at the first collective.
  idle_.push_back(connect());
}

AuthStore::~AuthStore() = default;

c10::intrusive_ptr<AuthStore> AuthStore::host(const std::string& bind_address, uint16_t port, std::string secret,
                                              std::chrono::milliseconds timeout) {
  auto server = std::make_shared<StoreServer>(bind_address, port, secret);
  // Connect to the address the server is bound to: with a non-loopback bind, 127.0.0.1 would be refused.
  auto client = c10::make_intrusive<AuthStore>(bind_address, server->port(), std::move(secret), timeout);
  client->server_ = std::move(server);
  return client;
}

std::string AuthStore::where() const { return host_ + ":" + std::to_string(port_); }

std::unique_ptr<AuthStore::Connection> AuthStore::connect() {
  const auto deadline = Clock::now() + timeout_;
  std::string last_error;
  auto socket = Socket::connect_until(host_, port_, deadline, last_error);
  if (!socket)
    throw CommError("cannot reach the rendezvous store at " + where() + " within " +
                        std::to_string(timeout_.count() / 1000) + " s: " + last_error,
                    "check that rank 0 is running and --master-addr/--master-port are right on every node");
  auto c = std::make_unique<Connection>();
  c->socket = std::move(*socket);
  // The handshake (Note [Store handshake]). Failures here are not retried: a wrong secret or a stranger
  // on the port will not get better by waiting.
  const auto hs_deadline = std::min(deadline, Clock::now() + std::chrono::seconds(30));
  Nonce server_nonce{};
  try {
    server_nonce = decode_hello(c->recv_frame(hs_deadline));
  } catch (const std::exception& e) {
    throw CommError("the process at " + where() + " did not greet this process as a cohort store (" + e.what() + ")",
                    "is something other than cohort's rank 0 listening on --master-port?");
  }
  const Nonce client_nonce = random_nonce();
  try {
    c->send_all(frame(encode_auth(client_nonce, client_proof(secret_, server_nonce, client_nonce))), hs_deadline);
    const Mac reply = decode_auth_reply(c->recv_frame(hs_deadline));
    if (!equal_macs(reply, server_proof(secret_, server_nonce, client_nonce)))
      throw CommError("the process at " + where() + " does not hold the job's secret: it is not this job's store",
                      "check --master-addr/--master-port, and that every machine has the same secret");
  } catch (const CommError& e) {
    throw CommError(std::string(e.what()) + " (store at " + where() + ")", e.hint());
  } catch (const std::exception& e) {
    throw CommError("the rendezvous store at " + where() + " closed the handshake (" + e.what() + ")",
                    "give every process the same secret: COHORT_TOKEN, or --token-file with the same file");
  }
  return c;
}

Response AuthStore::call(const Request& request, std::chrono::milliseconds reply_within) {
  std::unique_ptr<Connection> c;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!idle_.empty()) {
      c = std::move(idle_.back());
      idle_.pop_back();
    }
  }
  if (!c) c = connect();
  Response r;
  try {
    const auto deadline = Clock::now() + reply_within;
    c->send_all(frame(encode_request(request)), deadline);
    r = decode_response(c->recv_frame(deadline));
  } catch (const std::exception& e) {
    // The connection is dropped, not returned: its reply stream may be out of step now.
    throw CommError(std::string("the rendezvous store at ") + where() + " did not answer a " + op_name(request.op) +
                        " (" + e.what() + ")",
                    "rank 0 hosts the store: if it stopped, its own error says why");
  }
  std::lock_guard<std::mutex> lock(mutex_);
  idle_.push_back(std::move(c));
  return r;
}

void AuthStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  call({Op::kSet, {key}, {value}, 0}, timeout_);
}

std::vector<uint8_t> AuthStore::compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                           const std::vector<uint8_t>& desired) {
  return call({Op::kCompareSet, {key}, {expected, desired}, 0}, timeout_).value;
}

std::vector<uint8_t> AuthStore::get(const std::string& key) {
  wait({key});
  auto r = call({Op::kGet, {key}, {}, 0}, timeout_);
  if (r.status == Status::kNotFound)
    throw CommError("store key '" + key + "' vanished between wait and get", "a rank deleted a key others still read");
  return std::move(r.value);
}

int64_t AuthStore::add(const std::string& key, int64_t value) {
  return call({Op::kAdd, {key}, {}, value}, timeout_).number;
}

bool AuthStore::deleteKey(const std::string& key) { return call({Op::kDelete, {key}, {}, 0}, timeout_).number != 0; }

bool AuthStore::check(const std::vector<std::string>& keys) {
  return call({Op::kCheck, keys, {}, 0}, timeout_).number != 0;
}

int64_t AuthStore::getNumKeys() { return call({Op::kNumKeys, {}, {}, 0}, timeout_).number; }

void AuthStore::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void AuthStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  // The server treats 0 as "no timeout" (c10d's kNoTimeout) and clamps to a day; so does our own wait
  // for its reply, so that no sum overflows.
  constexpr std::chrono::milliseconds kDay(86'400'000);
  const auto bounded = timeout.count() <= 0 || timeout > kDay ? kDay : timeout;
  const auto r = call({Op::kWait, keys, {}, timeout.count() <= 0 ? 0 : bounded.count()}, bounded + kReplySlack);
  if (r.status == Status::kTimeout) {
    std::string names;
    for (const auto& k : keys) names += (names.empty() ? "" : ", ") + k;
    throw CommError("timed out after " + std::to_string(timeout.count()) + " ms waiting for store key(s) " + names,
                    "a rank did not reach the same point: its own error says why");
  }
}

c10::intrusive_ptr<c10d::Store> AuthStore::clone() {
  auto copy = c10::make_intrusive<AuthStore>(host_, port_, secret_, timeout_);
  copy->server_ = server_;
  return copy;
}

std::string secret_from_env() {
  if (const char* t = std::getenv("COHORT_TOKEN"); t && *t) return t;
  const char* file = std::getenv("COHORT_TOKEN_FILE");
  if (!file || !*file) return {};
  struct stat st {};
  if (stat(file, &st) != 0)
    throw CommError(std::string("cannot read the token file ") + file + ": " + std::strerror(errno),
                    "--token-file must name a file that exists on every machine");
  if (st.st_mode & (S_IRWXG | S_IRWXO))
    throw CommError(std::string("the token file ") + file + " can be read by other users",
                    std::string("run `chmod 600 ") + file + "`");
  std::ifstream in(file);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  if (s.empty())
    throw CommError(std::string("the token file ") + file + " is empty",
                    "put a long random string in it, e.g. "
                    "`openssl rand -hex 32 > FILE`");
  return s;
}

std::string random_secret() {
  const Nonce n = random_nonce();
  static const char* kHex = "0123456789abcdef";
  std::string s;
  for (uint8_t b : n) {
    s.push_back(kHex[b >> 4]);
    s.push_back(kHex[b & 15]);
  }
  return s;
}

}  // namespace cohort::store

#include "cohort/store/StoreServer.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <iostream>
#include <map>
#include <thread>
#include <unordered_map>

#include "cohort/store/StoreProtocol.h"
#include "cohort/util/Error.h"
#include "cohort/util/FileLimit.h"

namespace cohort::store {
namespace {

using Clock = std::chrono::steady_clock;

// A peer that connects and then sends nothing (or dribbles bytes) must not hold a slot forever.
constexpr auto kHandshakeTimeout = std::chrono::seconds(5);
// Connections that have not proved the secret yet: a stranger opening many of them evicts its own oldest
// ones, never the job's authenticated connections (Note [A crowd of ranks is not a flood]).
constexpr size_t kMaxUnauthenticated = 64;
// How long the oldest of them may wait before a newcomer evicts it: many times an honest handshake.
constexpr auto kHandshakeGrace = std::chrono::milliseconds(500);
// Past this much unsent reply data, stop reading a connection's requests until it reads its replies.
constexpr size_t kMaxPendingOut = 2 * static_cast<size_t>(kMaxFrameBytes);
// Refusals are logged one line each up to this many, then counted only: a port scan must not flood
// rank 0's output.
constexpr int64_t kMaxRefusalLines = 20;

std::string peer_name(const sockaddr_in& sa) {
  char buf[INET_ADDRSTRLEN] = "?";
  inet_ntop(AF_INET, &sa.sin_addr, buf, sizeof buf);
  return std::string(buf) + ":" + std::to_string(ntohs(sa.sin_port));
}

in_addr resolve_ipv4(const std::string& host) {
  in_addr a{};
  if (inet_pton(AF_INET, host == "localhost" ? "127.0.0.1" : host.c_str(), &a) == 1) return a;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || !res)
    throw CommError("cannot resolve the rendezvous address '" + host + "'",
                    "pass --master-addr as an IP address or a resolvable host name");
  a = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr;
  freeaddrinfo(res);
  return a;
}

struct Conn {
  int fd = -1;
  std::string peer;
  bool authed = false;
  Nonce nonce{};
  std::string in;
  std::string out;
  Clock::time_point opened;
  bool closing = false;  // close once `out` is flushed
};

struct Waiter {
  int fd;  // waiters of a connection are erased when it is dropped, so a reused fd never inherits them
  std::vector<std::string> keys;
  Clock::time_point deadline;
};

}  // namespace

// Note [Descriptors for a thousand ranks]
// The store used to keep 512 connections at most, under the usual soft limit of 1,024 descriptors. A rank
// holds one or two connections (its calls and its heartbeat), so a job past about 256 ranks could not
// start. The host raises its own soft descriptor limit to the hard one (as Go's runtime does at start;
// Debian's hard limit is 1,048,576, or 524,288 under systemd), and keeps half of what it then has for
// the store, so the process's Gloo sockets and checkpoint files still have the other half.
static size_t connection_limit() {
  const uint64_t limit = util::raise_open_file_limit();
  return static_cast<size_t>(std::clamp<uint64_t>(limit / 2, 16, 65536));
}

struct StoreServer::Impl {
  std::string address;
  uint16_t port = 0;
  std::string secret;
  Log log;
  int listen_fd = -1;
  int wake_fd = -1;
  std::atomic<int64_t> refused{0};
  Clock::time_point accept_paused_until{};
  size_t max_connections = connection_limit();
  std::thread thread;

  std::map<int, Conn> conns;
  std::unordered_map<std::string, Bytes> data;
  std::vector<Waiter> waiters;

  ~Impl() {
    if (thread.joinable()) {
      const uint64_t one = 1;
      (void)!write(wake_fd, &one, sizeof one);
      thread.join();
    }
    for (auto& [fd, c] : conns) close(fd);
    if (listen_fd >= 0) close(listen_fd);
    if (wake_fd >= 0) close(wake_fd);
  }

  void refuse(Conn& c, const std::string& why, bool tell_peer) {
    const int64_t n = ++refused;
    if (n <= kMaxRefusalLines)
      log("cohort: store: closed the connection from " + c.peer + ": " + why +
          (n == kMaxRefusalLines ? " (further refusals are counted, not logged)" : ""));
    if (tell_peer) {
      c.out += frame(encode_auth_refused(why));
      c.closing = true;
    } else {
      c.closing = true;
      c.out.clear();
    }
  }

  void reply(Conn& c, const Response& r) { c.out += frame(encode_response(r)); }

  bool all_present(const std::vector<std::string>& keys) const {
    return std::all_of(keys.begin(), keys.end(), [&](const std::string& k) { return data.count(k) > 0; });
  }

  void serve(Conn& c, const Request& r) {
    Response out;
    const std::string& key = r.keys.empty() ? std::string() : r.keys[0];
    switch (r.op) {
      case Op::kSet: data[key] = r.values[0]; break;
      case Op::kGet: {
        auto it = data.find(key);
        if (it == data.end())
          out.status = Status::kNotFound;
        else
          out.value = it->second;
        break;
      }
      case Op::kAdd: {
        int64_t v = 0;
        auto it = data.find(key);
        if (it != data.end()) {
          // c10d stores counters as decimal text; so do we, so that get() of a counter reads the same.
          try {
            v = std::stoll(std::string(it->second.begin(), it->second.end()));
          } catch (const std::exception&) {
            v = 0;
          }
        }
        v += r.number;
        const auto text = std::to_string(v);
        data[key] = Bytes(text.begin(), text.end());
        out.number = v;
        break;
      }
      case Op::kCompareSet: {
        auto it = data.find(key);
        const Bytes& expected = r.values[0];
        const Bytes& desired = r.values[1];
        if (it == data.end()) {
          if (expected.empty()) {
            data[key] = desired;
            out.value = desired;
          } else {
            out.value = expected;
          }
        } else if (it->second == expected) {
          it->second = desired;
          out.value = desired;
        } else {
          out.value = it->second;
        }
        break;
      }
      case Op::kDelete: out.number = data.erase(key) ? 1 : 0; break;
      case Op::kCheck: out.number = all_present(r.keys) ? 1 : 0; break;
      case Op::kNumKeys: out.number = static_cast<int64_t>(data.size()); break;
      case Op::kWait:
        if (!all_present(r.keys)) {
          // 0 means no timeout, as c10d's kNoTimeout; anything past a day is clamped to a day.
          const int64_t ms = r.number == 0 ? 86'400'000 : std::min<int64_t>(r.number, 86'400'000);
          waiters.push_back({c.fd, r.keys, Clock::now() + std::chrono::milliseconds(ms)});
          return;  // answered when the keys arrive or the time is up
        }
        break;
    }
    reply(c, out);
  }

  void wake_waiters() {
    const auto now = Clock::now();
    for (auto it = waiters.begin(); it != waiters.end();) {
      auto c = conns.find(it->fd);
      if (c == conns.end()) {
        it = waiters.erase(it);
      } else if (all_present(it->keys)) {
        reply(c->second, Response{});
        it = waiters.erase(it);
      } else if (now >= it->deadline) {
        reply(c->second, Response{Status::kTimeout, 0, {}});
        it = waiters.erase(it);
      } else {
        ++it;
      }
    }
  }

  void handle_frame(Conn& c, std::string_view payload) {
    if (!c.authed) {
      Nonce client_nonce{};
      Mac mac{};
      try {
        std::tie(client_nonce, mac) = decode_auth(payload);
      } catch (const ProtocolError& e) {
        return refuse(c, std::string("it did not complete the handshake (") + e.what() + ")", false);
      }
      if (!equal_macs(mac, client_proof(secret, c.nonce, client_nonce)))
        return refuse(c, "it does not hold the job's secret (wrong HMAC proof)", true);
      c.authed = true;
      c.out += frame(encode_auth_ok(server_proof(secret, c.nonce, client_nonce)));
      return;
    }
    Request r;
    try {
      r = decode_request(payload);
    } catch (const ProtocolError& e) {
      return refuse(c, e.what(), false);
    }
    serve(c, r);
  }

  void on_readable(Conn& c) {
    char buf[64 * 1024];
    // Never buffer more than one largest frame (and before the proof, one handshake frame): the frame
    // check below then rejects a peer that sends more, instead of us holding it.
    const size_t cap = 4 + (c.authed ? kMaxFrameBytes : kMaxHandshakeFrameBytes);
    for (;;) {
      const ssize_t n = recv(c.fd, buf, std::min(sizeof buf, cap + 1 - std::min(cap, c.in.size())), 0);
      if (n > 0) {
        c.in.append(buf, static_cast<size_t>(n));
        if (c.in.size() > cap || n < static_cast<ssize_t>(sizeof buf)) break;
        continue;
      }
      if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        c.closing = true;
        c.out.clear();
      }
      break;
    }
    size_t used = 0;
    while (!c.closing) {
      std::optional<FrameView> f;
      try {
        f = next_frame(std::string_view(c.in).substr(used), c.authed ? kMaxFrameBytes : kMaxHandshakeFrameBytes);
      } catch (const ProtocolError& e) {
        refuse(c, e.what(), false);
        break;
      }
      if (!f) break;
      handle_frame(c, f->payload);
      used += f->consumed;
    }
    c.in.erase(0, used);
  }

  void on_writable(Conn& c) {
    while (!c.out.empty()) {
      const ssize_t n = send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL);
      if (n > 0) {
        c.out.erase(0, static_cast<size_t>(n));
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
      c.out.clear();
      c.closing = true;
      return;
    }
  }

  // Note [A crowd of ranks is not a flood]
  // Past kMaxUnauthenticated connections waiting to prove the secret, a newcomer used to evict the oldest
  // at once. That held off a stranger holding connections open, but 1,024 ranks connecting together
  // evicted each other before any could answer its challenge, again at every retry: every rank failed
  // after dist.timeout_s (bench/store_latency, issue 41; c10d's TCPStore took 0.43 s). Now the rest wait
  // in the kernel's backlog while the oldest is younger than kHandshakeGrace (an honest proof takes one
  // round trip), and only an older one is evicted: a crowd gets in as fast as it proves the secret, and
  // strangers still cannot hold the door for more than the grace.
  // Whether a newcomer may be accepted now: fewer than kMaxUnauthenticated connections wait to prove the
  // secret, or the oldest of them has had its grace (and is dropped for it). If not, `resume` is when the
  // oldest's grace ends.
  bool make_room(Clock::time_point& resume) {
    size_t unauthenticated = 0;
    auto oldest = conns.end();
    for (auto it = conns.begin(); it != conns.end(); ++it)
      if (!it->second.authed && !it->second.closing) {
        ++unauthenticated;
        if (oldest == conns.end() || it->second.opened < oldest->second.opened) oldest = it;
      }
    if (unauthenticated < kMaxUnauthenticated || oldest == conns.end()) return true;
    if (Clock::now() - oldest->second.opened < kHandshakeGrace) {
      resume = std::min(resume, oldest->second.opened + kHandshakeGrace);
      return false;
    }
    refuse(oldest->second, "too many connections waiting to prove the secret; the oldest is dropped", false);
    return true;
  }

  void accept_all() {
    for (;;) {
      auto resume = Clock::time_point::max();
      if (!make_room(resume)) return;
      sockaddr_in sa{};
      socklen_t len = sizeof sa;
      const int fd = accept4(listen_fd, reinterpret_cast<sockaddr*>(&sa), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        // Out of descriptors: pause accepting for a moment rather than spin on a readable listener.
        if (errno == EMFILE || errno == ENFILE) accept_paused_until = Clock::now() + std::chrono::milliseconds(200);
        return;
      }
      const bool over = conns.size() >= max_connections;
      const int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      Conn c;
      c.fd = fd;
      c.peer = peer_name(sa);
      c.nonce = random_nonce();
      c.opened = Clock::now();
      c.out = frame(encode_hello(c.nonce));
      auto& added = conns.emplace(fd, std::move(c)).first->second;
      if (over)
        refuse(added,
               "the store holds " + std::to_string(max_connections) + " connections, its limit (half of the " +
                   std::to_string(2 * max_connections) + " descriptors ulimit -n allows rank 0's process): raise " +
                   "ulimit -n (the hard limit) where rank 0 runs",
               true);
    }
  }

  void run() {
    std::vector<pollfd> fds;
    for (;;) {
      const auto now = Clock::now();
      auto next = now + std::chrono::seconds(1);
      for (const auto& w : waiters) next = std::min(next, w.deadline);
      const bool accepting = now >= accept_paused_until && make_room(next);
      if (accept_paused_until > now) next = std::min(next, accept_paused_until);
      for (auto& [fd, c] : conns)
        if (!c.authed) {
          if (now - c.opened > kHandshakeTimeout && !c.closing) refuse(c, "it sent no handshake within 5 s", false);
          next = std::min(next, c.opened + (c.closing ? kHandshakeTimeout * 2 : kHandshakeTimeout));
        }
      // Drop the connections that are done.
      for (auto it = conns.begin(); it != conns.end();) {
        // A closing stranger that does not read its refusal is dropped anyway after twice the handshake time.
        const bool stuck = !it->second.authed && now - it->second.opened > kHandshakeTimeout * 2;
        if (it->second.closing && (it->second.out.empty() || stuck)) {
          const int fd = it->first;
          waiters.erase(std::remove_if(waiters.begin(), waiters.end(), [fd](const Waiter& w) { return w.fd == fd; }),
                        waiters.end());
          close(fd);
          it = conns.erase(it);
        } else {
          ++it;
        }
      }
      fds.clear();
      fds.push_back({wake_fd, POLLIN, 0});
      fds.push_back({listen_fd, static_cast<short>(accepting ? POLLIN : 0), 0});
      for (auto& [fd, c] : conns) {
        const bool read = !c.closing && c.out.size() < kMaxPendingOut;
        fds.push_back({fd, static_cast<short>((read ? POLLIN : 0) | (c.out.empty() ? 0 : POLLOUT)), 0});
      }
      const auto wait_ms = std::chrono::duration_cast<std::chrono::milliseconds>(next - Clock::now()).count();
      const int n = poll(fds.data(), fds.size(), static_cast<int>(std::clamp<int64_t>(wait_ms + 1, 0, 1000)));
      if (n < 0 && errno != EINTR) {
        log(std::string("cohort: store: poll failed: ") + std::strerror(errno) + "; the server stops");
        return;
      }
      if (fds[0].revents & POLLIN) return;
      if (fds[1].revents & POLLIN) accept_all();
      for (size_t i = 2; i < fds.size(); ++i) {
        auto it = conns.find(fds[i].fd);
        if (it == conns.end()) continue;
        auto& c = it->second;
        if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) on_readable(c);
        if (fds[i].revents & POLLOUT) on_writable(c);
      }
      wake_waiters();
      for (auto& [fd, c] : conns)
        if (!c.out.empty()) on_writable(c);
    }
  }
};

StoreServer::StoreServer(const std::string& bind_address, uint16_t port, std::string secret, Log log)
    : impl_(std::make_unique<Impl>()) {
  auto& s = *impl_;
  s.address = bind_address;
  s.secret = std::move(secret);
  s.log = log ? std::move(log) : [](const std::string& line) { std::cerr << line << std::endl; };
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  sa.sin_addr = resolve_ipv4(bind_address);
  const std::string where = bind_address + ":" + std::to_string(port);
  s.listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (s.listen_fd < 0)
    throw CommError(std::string("cannot open a socket for the rendezvous store: ") + std::strerror(errno));
  // A restarted job reuses the port while the last one's connections linger in TIME_WAIT.
  const int one = 1;
  setsockopt(s.listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(s.listen_fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    const int err = errno;
    if (err == EADDRINUSE)
      throw CommError(
          "cannot host the rendezvous store: port " + std::to_string(port) + " is already in use on " + bind_address,
          "pick a free port with --master-port, or stop the program using it");
    if (err == EADDRNOTAVAIL)
      throw CommError(
          "cannot host the rendezvous store at " + where + ": " + bind_address + " is not an address of this machine",
          "on node 0, --master-addr must name one of its own addresses (see `ip -4 addr`)");
    throw CommError("cannot host the rendezvous store at " + where + ": " + std::strerror(err));
  }
  if (listen(s.listen_fd, SOMAXCONN) != 0)  // a job's ranks connect at once: Note [A crowd of ranks is not a flood]
    throw CommError("cannot listen for the rendezvous store at " + where + ": " + std::strerror(errno));
  socklen_t len = sizeof sa;
  getsockname(s.listen_fd, reinterpret_cast<sockaddr*>(&sa), &len);
  s.port = ntohs(sa.sin_port);
  s.wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (s.wake_fd < 0)
    throw CommError(std::string("cannot create the store's wake-up descriptor: ") + std::strerror(errno));
  s.thread = std::thread([&s] {
    try {
      s.run();
    } catch (const std::exception& e) {
      // Clients then fail with "did not answer", naming the store; say why here.
      s.log(std::string("cohort: store: the server stopped: ") + e.what());
    }
  });
}

StoreServer::~StoreServer() = default;

uint16_t StoreServer::port() const { return impl_->port; }
const std::string& StoreServer::address() const { return impl_->address; }
int64_t StoreServer::refused() const { return impl_->refused.load(); }

}  // namespace cohort::store

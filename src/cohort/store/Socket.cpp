#include "cohort/store/Socket.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <thread>

namespace cohort::store {

int remaining_ms(Clock::time_point deadline) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(ms, 0, 1 << 30));
}

Socket::~Socket() {
  if (fd_ >= 0) close(fd_);
}

Socket::Socket(Socket&& other) noexcept : fd_(other.fd_), pending_(std::move(other.pending_)) { other.fd_ = -1; }

Socket& Socket::operator=(Socket&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    fd_ = other.fd_;
    pending_ = std::move(other.pending_);
    other.fd_ = -1;
  }
  return *this;
}

std::optional<Socket> Socket::connect_until(const std::string& host, uint16_t port, Clock::time_point deadline,
                                            std::string& last_error) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  last_error = "no attempt";
  auto backoff = std::chrono::milliseconds(10);
  for (;;) {
    addrinfo* res = nullptr;
    const int gai =
        getaddrinfo(host == "localhost" ? "127.0.0.1" : host.c_str(), std::to_string(port).c_str(), &hints, &res);
    if (gai == 0 && res) {
      Socket s(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
      // A host that drops packets would hold a blocking connect for about two minutes: bound each try.
      const int try_ms = std::min(remaining_ms(deadline), 5000);
      timeval tv{try_ms / 1000, (try_ms % 1000) * 1000};
      if (s.fd_ >= 0) setsockopt(s.fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
      const int rc = s.fd_ < 0 ? -1 : ::connect(s.fd_, res->ai_addr, res->ai_addrlen);
      const int err = errno;
      freeaddrinfo(res);
      if (rc == 0) {
        const int one = 1;
        setsockopt(s.fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        return s;
      }
      last_error = std::strerror(err);
    } else {
      last_error = gai_strerror(gai);
    }
    if (Clock::now() + backoff >= deadline) return std::nullopt;
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
  }
}

void Socket::send_all(std::string_view bytes, Clock::time_point deadline) {
  size_t off = 0;
  while (off < bytes.size()) {
    pollfd p{fd_, POLLOUT, 0};
    if (poll(&p, 1, remaining_ms(deadline)) <= 0) throw std::runtime_error("sending timed out");
    const ssize_t n = send(fd_, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw std::runtime_error(std::string("the connection broke: ") + std::strerror(errno));
    off += static_cast<size_t>(n);
  }
}

void Socket::recv_some(std::string& buffer, Clock::time_point deadline) {
  char chunk[64 * 1024];
  for (;;) {
    pollfd p{fd_, POLLIN, 0};
    const int ready = poll(&p, 1, remaining_ms(deadline));
    if (ready == 0) throw std::runtime_error("no reply in time");
    if (ready < 0 && errno == EINTR) continue;
    const ssize_t n = recv(fd_, chunk, sizeof chunk, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n == 0 || (n < 0 && errno == ECONNRESET)) throw PeerClosed("the store closed the connection");
    if (n < 0) throw std::runtime_error(std::string("the connection broke: ") + std::strerror(errno));
    buffer.append(chunk, static_cast<size_t>(n));
    return;
  }
}

std::string Socket::recv_exact(size_t n, Clock::time_point deadline) {
  while (pending_.size() < n) recv_some(pending_, deadline);
  std::string out = pending_.substr(0, n);
  pending_.erase(0, n);
  return out;
}

}  // namespace cohort::store

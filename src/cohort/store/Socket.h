// A TCP connection to a store whose every send and receive has a deadline, shared by cohort's two store
// clients: AuthStore (cohort's own store) and TcpStoreClient (torchrun's agent store).
//
//   std::string why;
//   auto s = cohort::store::Socket::connect_until("127.0.0.1", 29500, deadline, why);  // nullopt: see why
//   s->send_all(bytes, deadline);
//   std::string got = s->recv_exact(8, deadline);
//
// Failures throw std::runtime_error with the bare reason ("no reply in time"; PeerClosed for "the store
// closed the connection"); the caller knows which store it was and adds the address and a hint.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace cohort::store {

using Clock = std::chrono::steady_clock;

// Milliseconds left until `deadline`, clamped to what poll() takes.
int remaining_ms(Clock::time_point deadline);

// The other end closed the connection (an orderly close or a reset): a fact some protocols rely on.
class PeerClosed : public std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Socket {
 public:
  Socket() = default;
  ~Socket();
  Socket(Socket&& other) noexcept;
  Socket& operator=(Socket&& other) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  // Connects to host:port (IPv4), retrying with a growing pause while nothing listens there, so that
  // processes may start in any order. nullopt once `deadline` has passed; `last_error` then says why
  // the last try failed.
  static std::optional<Socket> connect_until(const std::string& host, uint16_t port, Clock::time_point deadline,
                                             std::string& last_error);

  void send_all(std::string_view bytes, Clock::time_point deadline);
  // Appends at least one byte that arrived to `buffer`.
  void recv_some(std::string& buffer, Clock::time_point deadline);
  // Exactly `n` bytes: first those already in `pending_`, then what arrives.
  std::string recv_exact(size_t n, Clock::time_point deadline);

 private:
  explicit Socket(int fd) : fd_(fd) {}
  int fd_ = -1;
  std::string pending_;
};

}  // namespace cohort::store

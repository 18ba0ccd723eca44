// The rendezvous store's server: a key-value map that rank 0 hosts for the job, reachable only on the
// address it is given and only by processes that prove they hold the job's secret.
//
//   auto server = std::make_shared<cohort::store::StoreServer>("127.0.0.1", 29500, secret);
//   // ... clients connect with cohort::store::AuthStore(addr, server->port(), secret, timeout)
//
// One thread polls every connection; nothing it receives is acted on before the handshake (Note [Store
// handshake]) succeeds. A frame that is oversized or malformed closes the connection that sent it, and a
// line on stderr says who and why. The map lives as long as the server.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace cohort::store {

class StoreServer {
 public:
  using Log = std::function<void(const std::string&)>;
  // Binds to `bind_address` (an IPv4 address or a host name resolving to one of this machine's) and
  // `port` (0: any free port). Throws CommError naming the address when the port is in use or the address
  // is not this machine's. `log` receives one line per refused connection (default: stderr).
  StoreServer(const std::string& bind_address, uint16_t port, std::string secret, Log log = {});
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  uint16_t port() const;
  const std::string& address() const;
  // Connections closed for failing the handshake or breaking the protocol, for tests and logs.
  int64_t refused() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cohort::store

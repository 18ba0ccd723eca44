// The client side of cohort's rendezvous store: a c10d::Store (so Gloo and PrefixStore use it as they
// would TCPStore) that talks to a StoreServer after proving it holds the job's secret.
//
//   auto store = cohort::store::AuthStore::host("127.0.0.1", 29500, secret, std::chrono::seconds(60));
//   auto peer = c10::make_intrusive<cohort::store::AuthStore>("10.0.0.1", 29500, secret, timeout);
//   peer->set("k", {1, 2});  peer->get("k");   // get waits for the key, as c10d's stores do
//
// Each thread that talks to the store at once gets its own connection from a small pool, so the
// heartbeat never waits behind a long wait(). Connecting retries until the timeout, so ranks may start
// in any order; then the message names the address.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "cohort/store/StoreProtocol.h"

namespace cohort::store {

class StoreServer;

class AuthStore : public c10d::Store {
 public:
  AuthStore(std::string host, uint16_t port, std::string secret, std::chrono::milliseconds timeout);
  ~AuthStore() override;

  // Starts a StoreServer on `bind_address:port` in this process and returns a client of it; the server
  // lives as long as this client (and its clones).
  static c10::intrusive_ptr<AuthStore> host(const std::string& bind_address, uint16_t port, std::string secret,
                                            std::chrono::milliseconds timeout);

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override;
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;
  // LibTorch 2.x made clone() a pure virtual of c10d::Store; in 1.13 it is simply ours. No `override`
  // so that one declaration compiles against both.
  virtual c10::intrusive_ptr<c10d::Store> clone();

  uint16_t port() const { return port_; }
  const std::shared_ptr<StoreServer>& server() const { return server_; }

 private:
  struct Connection;
  std::unique_ptr<Connection> connect();
  Response call(const Request& request, std::chrono::milliseconds reply_within);
  std::string where() const;

  std::string host_;
  uint16_t port_;
  std::string secret_;
  std::shared_ptr<StoreServer> server_;
  std::mutex mutex_;
  std::vector<std::unique_ptr<Connection>> idle_;
};

// The job's secret, from COHORT_TOKEN or the file named by COHORT_TOKEN_FILE (which must not be readable
// by others, as ssh insists for its keys). Empty when neither is set.
std::string secret_from_env();

// A fresh random secret (hex), for a launcher that starts every worker itself.
std::string random_secret();

}  // namespace cohort::store

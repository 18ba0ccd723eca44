// A client of c10d's TCPStore, the store torchrun's elastic agent hosts for its workers
// (TORCHELASTIC_USE_AGENT_STORE=True). cohort speaks the wire protocol itself, in both of its generations,
// because LibTorch's own client speaks only its own version's: 1.13's waits forever on a 2.x agent. See
// Note [c10d's two store protocols] in TcpStoreClient.cpp.
//
//   auto store = c10::make_intrusive<cohort::store::TcpStoreClient>("127.0.0.1", 29500, std::chrono::seconds(60),
//                                                                    "torchrun's agent store");
//   store->add("k", 1);
//   store->protocol();   // TcpStoreProtocol::kValidated against torch 2.x's agent, kLegacy against 1.13's
//
// Every call has a deadline; a store that answers in neither generation fails the constructor within the
// timeout with a message naming the store. Each thread that talks to the store at once gets its own
// connection, as in AuthStore.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Store.hpp>

namespace cohort::store {

// kLegacy: LibTorch 1.13's numbering, no handshake. kValidated: LibTorch 2.x's, where a connection opens
// with a VALIDATE query carrying a magic number.
enum class TcpStoreProtocol { kLegacy, kValidated };
const char* protocol_name(TcpStoreProtocol p);

// The wire format, free of sockets so that it is unit-tested byte for byte.
namespace tcpstore {
enum class Query { kSet, kCompareSet, kGet, kAdd, kCheck, kWait, kNumKeys, kDelete };
uint8_t query_code(TcpStoreProtocol p, Query q);
const char* query_name(Query q);
// One query: its code, then keys as (u64 length, bytes), values likewise, numbers as i64; little-endian.
std::string encode(TcpStoreProtocol p, Query q, const std::vector<std::string>& keys,
                   const std::vector<std::vector<uint8_t>>& values = {}, int64_t number = 0);
// What a new connection sends to learn which generation the server speaks: a 2.x server validates it and
// answers each of kProbeQueries GETNUMKEYS with an i64; a 1.13 server reads the same bytes as a SET
// whose key is longer than any machine's memory, fails, and closes the connection.
std::string probe();
inline constexpr int kProbeQueries = 4;
// What a connection sends first under kValidated.
std::string validate();
}  // namespace tcpstore

class TcpStoreClient : public c10d::Store {
 public:
  // `what` names the store in messages ("torchrun's agent store"). Connects and probes now, so that a
  // wrong address or a stranger on the port fails at rendezvous, within `timeout`.
  TcpStoreClient(std::string host, uint16_t port, std::chrono::milliseconds timeout, std::string what);
  ~TcpStoreClient() override;

  TcpStoreProtocol protocol() const { return protocol_; }

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
  // A pure virtual from LibTorch 2.x on; see AuthStore::clone.
  virtual c10::intrusive_ptr<c10d::Store> clone();

 private:
  struct Connection;
  struct Reply;
  // A new connection; `validate` sends 2.x's opening query (the probe's connection sends its own).
  std::unique_ptr<Connection> connect(bool validate);
  TcpStoreProtocol detect(Connection& c);
  // Sends one query and reads its reply with `read`, on a connection of the pool.
  template <typename Read>
  auto call(tcpstore::Query q, const std::string& bytes, std::chrono::milliseconds reply_within, Read read);
  std::string where() const;

  std::string host_;
  uint16_t port_;
  std::string what_;
  TcpStoreProtocol protocol_ = TcpStoreProtocol::kValidated;
  std::mutex mutex_;
  std::vector<std::unique_ptr<Connection>> idle_;
};

}  // namespace cohort::store

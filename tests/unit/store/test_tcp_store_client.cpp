// cohort's client of c10d's TCPStore (torchrun's agent store): the wire bytes of both protocols, then
// the client against the LibTorch it is built with, hosting c10d's own server in this process (1.13's
// under Debian's build, 2.x's classic and libuv servers under pip's), and against a store that answers
// in neither protocol. torch 2.14's torchrun itself is in tests/reference/torchrun.py.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <thread>

#include <gtest/gtest.h>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "cohort/store/TcpStoreClient.h"
#include "cohort/util/Error.h"
#include "cohort/util/TorchCompat.h"

namespace cohort::store {
namespace {

using namespace std::chrono_literals;
using tcpstore::Query;

std::vector<uint8_t> b(const std::string& s) { return {s.begin(), s.end()}; }

std::string hex(const std::string& bytes) {
  static const char* kHex = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) out += std::string{kHex[c >> 4], kHex[c & 15]} + " ";
  return out;
}

TEST(TcpStoreWire, CodesMovedUpByOneWhenValidateCameExceptDeleteKey) {
  const Query all[] = {Query::kSet,   Query::kCompareSet, Query::kGet,     Query::kAdd,
                       Query::kCheck, Query::kWait,       Query::kNumKeys, Query::kDelete};
  for (Query q : all) {
    const int legacy = tcpstore::query_code(TcpStoreProtocol::kLegacy, q);
    const int validated = tcpstore::query_code(TcpStoreProtocol::kValidated, q);
    EXPECT_EQ(validated, q == Query::kDelete ? legacy : legacy + 1) << tcpstore::query_name(q);
  }
}

TEST(TcpStoreWire, QueriesAreLengthPrefixedLittleEndian) {
  EXPECT_EQ(hex(tcpstore::encode(TcpStoreProtocol::kLegacy, Query::kSet, {"k"}, {b("ab")})),
            "00 01 00 00 00 00 00 00 00 6b 02 00 00 00 00 00 00 00 61 62 ");
  EXPECT_EQ(hex(tcpstore::encode(TcpStoreProtocol::kValidated, Query::kAdd, {"n"}, {}, -2)),
            "04 01 00 00 00 00 00 00 00 6e fe ff ff ff ff ff ff ff ");
  EXPECT_EQ(hex(tcpstore::encode(TcpStoreProtocol::kValidated, Query::kWait, {"a", "b"})),
            "06 02 00 00 00 00 00 00 00 01 00 00 00 00 00 00 00 61 01 00 00 00 00 00 00 00 62 ");
  EXPECT_EQ(hex(tcpstore::encode(TcpStoreProtocol::kLegacy, Query::kNumKeys, {})), "06 ");
  // VALIDATE and the magic number, then four GETNUMKEYS: as a 1.13 SET, a key length past any memory.
  EXPECT_EQ(hex(tcpstore::probe()), "00 ce f7 85 3c 07 07 07 07 ");
}

// c10d's own server, of the LibTorch this binary is built with. `libuv` asks 2.x for its libuv server.
c10::intrusive_ptr<c10d::TCPStore> c10d_server(bool libuv = false) {
  auto opts = util::compat::tcp_store_options(0, /*is_server=*/true, 1, 30s);
#if TORCH_VERSION_MAJOR >= 2
  opts.useLibUV = libuv;
#else
  (void)libuv;
#endif
  return c10::make_intrusive<c10d::TCPStore>("127.0.0.1", opts);
}

TcpStoreProtocol expected_protocol() {
  return util::compat::kTorchMajor >= 2 ? TcpStoreProtocol::kValidated : TcpStoreProtocol::kLegacy;
}

void check_every_operation(c10d::TCPStore& server) {
  TcpStoreClient store("127.0.0.1", server.getPort(), 5s, "the test's store");
  EXPECT_EQ(store.protocol(), expected_protocol());
  store.set("k", b("value"));
  EXPECT_EQ(store.get("k"), b("value"));
  EXPECT_EQ(store.add("n", 3), 3);
  EXPECT_EQ(store.add("n", -1), 2);
  EXPECT_EQ(store.compareSet("k", b("value"), b("new")), b("new"));
  EXPECT_EQ(store.compareSet("k", b("stale"), b("other")), b("new"));
  EXPECT_TRUE(store.check({"k", "n"}));
  EXPECT_FALSE(store.check({"k", "absent"}));
  EXPECT_TRUE(store.deleteKey("k"));
  EXPECT_FALSE(store.deleteKey("k"));
  EXPECT_FALSE(store.check({"k"}));
  // What cohort writes, LibTorch's own client reads, and the other way round.
  store.set("from-cohort", b("1"));
  EXPECT_EQ(server.get("from-cohort"), b("1"));
  server.set("from-c10d", b("2"));
  EXPECT_EQ(store.get("from-c10d"), b("2"));
  EXPECT_GE(store.getNumKeys(), 3);
  // A wait ends when another thread's set arrives, on a connection of its own.
  std::thread later([&] {
    std::this_thread::sleep_for(200ms);
    store.set("late", b("x"));
  });
  store.wait({"late"}, 5s);
  later.join();
  try {
    store.wait({"never"}, 300ms);
    ADD_FAILURE() << "a wait for a key nobody sets returned";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("timed out after 300 ms waiting for key(s) never in the test's store at"),
              std::string::npos)
        << e.what();
  }
  // The timed-out wait's connection was dropped; the store goes on answering.
  EXPECT_EQ(store.add("n", 1), 3);
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

TEST(TcpStoreClient, SpeaksTheProtocolOfTheLibTorchItIsBuiltWith) {
  // Against 1.13's server the probe makes that server try a half-exabyte allocation, in this process. A
  // sanitizer's allocator reports that and ends the process, where the real one throws and the server
  // goes on (Note [c10d's two store protocols]); the plain build runs this test.
  if (kSanitized && util::compat::kTorchMajor < 2)
    GTEST_SKIP() << "under a sanitizer, LibTorch 1.13's in-process server cannot take the probe's failed "
                    "allocation; `make test` runs this test";
  auto server = c10d_server();
  check_every_operation(*server);
  // The probe cost the server nothing: a fresh client of LibTorch's own still works.
  auto opts = util::compat::tcp_store_options(server->getPort(), /*is_server=*/false, 1, 5s);
  c10d::TCPStore theirs("127.0.0.1", opts);
  EXPECT_EQ(theirs.get("from-cohort"), b("1"));
}

TEST(TcpStoreClient, SpeaksToTheLibuvServerOfLibTorch2) {
  if (util::compat::kTorchMajor < 2)
    GTEST_SKIP() << "LibTorch " << util::compat::kTorchMajor << "." << util::compat::kTorchMinor
                 << " has no libuv server; tests/reference/torchrun.py covers 2.14's";
  c10::intrusive_ptr<c10d::TCPStore> server;
  try {
    server = c10d_server(/*libuv=*/true);
  } catch (const std::exception& e) {
    // A LibTorch built without libuv (a distribution's may be) refuses to start that server.
    GTEST_SKIP() << "this LibTorch cannot start its libuv server: " << std::string(e.what()).substr(0, 200);
  }
  check_every_operation(*server);
}

// A listener that accepts and then does `answer` with each connection, until the test ends.
class Stranger {
 public:
  explicit Stranger(std::function<void(int)> answer) : answer_(std::move(answer)) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    EXPECT_EQ(listen(fd_, 8), 0);
    socklen_t len = sizeof a;
    getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] {
      for (;;) {
        const int c = accept(fd_, nullptr, nullptr);
        if (c < 0 || stop_) break;
        answer_(c);
        conns_.push_back(c);
      }
    });
  }
  ~Stranger() {
    stop_ = true;
    shutdown(fd_, SHUT_RDWR);
    thread_.join();
    close(fd_);
    for (int c : conns_) close(c);
  }
  uint16_t port() const { return port_; }

 private:
  std::function<void(int)> answer_;
  int fd_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::vector<int> conns_;
  std::thread thread_;
};

std::string refusal(uint16_t port, std::chrono::milliseconds timeout) {
  try {
    TcpStoreClient store("127.0.0.1", port, timeout, "torchrun's agent store");
  } catch (const CommError& e) {
    return std::string(e.what()) + " | " + e.hint();
  }
  return "no error";
}

TEST(TcpStoreClient, AStoreSilentInBothProtocolsFailsWithinTheTimeoutNamingTheStore) {
  Stranger silent([](int) {});
  const auto started = std::chrono::steady_clock::now();
  const std::string msg = refusal(silent.port(), 1s);
  EXPECT_LT(std::chrono::steady_clock::now() - started, 10s);
  EXPECT_NE(msg.find("torchrun's agent store at 127.0.0.1:" + std::to_string(silent.port()) +
                     " accepted a connection but did not answer in either protocol of c10d's TCPStore within 1 s"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("TORCHELASTIC_USE_AGENT_STORE"), std::string::npos) << msg;
}

TEST(TcpStoreClient, AStoreAnsweringBytesOfAnotherProtocolIsRefused) {
  Stranger garbage([](int c) {
    const std::string junk(64, '\xff');
    (void)!write(c, junk.data(), junk.size());
  });
  const std::string msg = refusal(garbage.port(), 5s);
  EXPECT_NE(msg.find("answered cohort's protocol probe with bytes that are not c10d TCPStore's"), std::string::npos)
      << msg;
}

TEST(TcpStoreClient, NothingListeningIsNamedWithinTheTimeout) {
  const std::string msg = refusal(1, 1s);  // port 1: nothing listens there
  EXPECT_NE(msg.find("cannot reach torchrun's agent store at 127.0.0.1:1 within 1 s"), std::string::npos) << msg;
}

}  // namespace
}  // namespace cohort::store

// The authenticated rendezvous store: the wire codec on its own, then a real server and real clients
// on loopback: the c10d operations, a wrong secret, a stranger that skips the handshake, an oversized
// frame, and the bind address.
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <optional>
#include <thread>

#include <gtest/gtest.h>

#include "cohort/store/AuthStore.h"
#include "cohort/store/StoreProtocol.h"
#include "cohort/store/StoreServer.h"

namespace cohort::store {
namespace {

using namespace std::chrono_literals;

std::vector<uint8_t> b(const std::string& s) { return {s.begin(), s.end()}; }

TEST(StoreProtocol, RequestsRoundTrip) {
  const std::vector<Request> requests = {
      {Op::kSet, {"k"}, {b("value")}, 0}, {Op::kGet, {"k"}, {}, 0},
      {Op::kAdd, {"n"}, {}, -7},          {Op::kCompareSet, {"k"}, {b("a"), b("")}, 0},
      {Op::kDelete, {"k"}, {}, 0},        {Op::kCheck, {"a", "b"}, {}, 0},
      {Op::kNumKeys, {}, {}, 0},          {Op::kWait, {"a", "bb", "ccc"}, {}, 1500},
  };
  for (const auto& r : requests) {
    const Request back = decode_request(encode_request(r));
    EXPECT_EQ(back.op, r.op);
    EXPECT_EQ(back.keys, r.keys);
    EXPECT_EQ(back.values, r.values);
    EXPECT_EQ(back.number, r.number);
  }
  const Response resp{Status::kTimeout, 42, b("xyz")};
  const Response rb = decode_response(encode_response(resp));
  EXPECT_EQ(rb.status, Status::kTimeout);
  EXPECT_EQ(rb.number, 42);
  EXPECT_EQ(rb.value, b("xyz"));
}

TEST(StoreProtocol, MalformedRequestsAreRejectedWithAReason) {
  const std::string good = encode_request({Op::kSet, {"key"}, {b("value")}, 0});
  for (size_t cut = 0; cut < good.size(); ++cut)
    EXPECT_THROW(decode_request(good.substr(0, cut)), ProtocolError) << "cut at " << cut;
  EXPECT_THROW(decode_request(good + "x"), ProtocolError);              // trailing bytes
  EXPECT_THROW(decode_request(std::string(1, '\x09')), ProtocolError);  // unknown op
  EXPECT_THROW(decode_request(std::string(1, '\x00')), ProtocolError);
  // A value length far past the payload: rejected before any allocation.
  std::string huge = good.substr(0, 1 + 4 + 3) + std::string("\xff\xff\xff\x7f", 4);
  try {
    decode_request(huge);
    FAIL() << "no error";
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find("remain"), std::string::npos) << e.what();
  }
  // Zero keys, too many keys, a key over the limit, a negative wait.
  EXPECT_THROW(decode_request(std::string("\x06\x00\x00\x00\x00", 5)), ProtocolError);
  EXPECT_THROW(decode_request(encode_request({Op::kCheck, std::vector<std::string>(kMaxKeys + 1, "k"), {}, 0})),
               ProtocolError);
  EXPECT_THROW(decode_request(encode_request({Op::kGet, {std::string(kMaxKeyBytes + 1, 'k')}, {}, 0})), ProtocolError);
  EXPECT_THROW(decode_request(encode_request({Op::kWait, {"k"}, {}, -1})), ProtocolError);
}

TEST(StoreProtocol, FramesAreSplitAndBounded) {
  const std::string two = frame("abc") + frame("de");
  auto f = next_frame(two, 100);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->payload, "abc");
  EXPECT_EQ(f->consumed, 7u);
  EXPECT_EQ(next_frame(std::string_view(two).substr(0, 5), 100), std::nullopt);
  EXPECT_THROW(next_frame(frame(std::string(300, 'x')), kMaxHandshakeFrameBytes), ProtocolError);
}

TEST(StoreProtocol, ProofsDependOnSecretNoncesAndRole) {
  const Nonce s = random_nonce(), c = random_nonce();
  EXPECT_TRUE(equal_macs(client_proof("secret", s, c), client_proof("secret", s, c)));
  EXPECT_FALSE(equal_macs(client_proof("secret", s, c), client_proof("secreT", s, c)));
  EXPECT_FALSE(equal_macs(client_proof("secret", s, c), client_proof("secret", c, s)));
  EXPECT_FALSE(equal_macs(client_proof("secret", s, c), server_proof("secret", s, c)));
  EXPECT_NE(random_secret(), random_secret());
  EXPECT_EQ(random_secret().size(), 64u);
}

struct Server {
  std::vector<std::string> log;
  std::mutex mu;
  std::shared_ptr<StoreServer> server;
  explicit Server(const std::string& secret, const std::string& addr = "127.0.0.1") {
    server = std::make_shared<StoreServer>(addr, 0, secret, [this](const std::string& line) {
      std::lock_guard<std::mutex> lock(mu);
      log.push_back(line);
    });
  }
  std::string joined() {
    std::lock_guard<std::mutex> lock(mu);
    std::string s;
    for (const auto& l : log) s += l + "\n";
    return s;
  }
};

TEST(AuthStore, ImplementsTheStoreOperations) {
  Server s("s3cret");
  auto a = c10::make_intrusive<AuthStore>("127.0.0.1", s.server->port(), "s3cret", 10s);
  auto c = c10::make_intrusive<AuthStore>("localhost", s.server->port(), "s3cret", 10s);
  a->set("k", b("v1"));
  EXPECT_EQ(c->get("k"), b("v1"));
  EXPECT_EQ(a->add("n", 5), 5);
  EXPECT_EQ(c->add("n", -2), 3);
  EXPECT_EQ(a->get("n"), b("3"));  // counters read as decimal text, as in c10d
  EXPECT_EQ(a->compareSet("k", b("wrong"), b("v2")), b("v1"));
  EXPECT_EQ(a->compareSet("k", b("v1"), b("v2")), b("v2"));
  EXPECT_EQ(a->compareSet("new", b(""), b("x")), b("x"));
  EXPECT_TRUE(a->check({"k", "n"}));
  EXPECT_FALSE(a->check({"k", "missing"}));
  EXPECT_EQ(a->getNumKeys(), 3);
  EXPECT_TRUE(a->deleteKey("new"));
  EXPECT_FALSE(a->deleteKey("new"));
  // get() waits for a key another client sets later, as c10d's stores do.
  std::thread later([&] {
    std::this_thread::sleep_for(200ms);
    c->set("late", b("here"));
  });
  EXPECT_EQ(a->get("late"), b("here"));
  later.join();
  // wait() with a timeout ends with an error naming the key.
  try {
    a->wait({"never"}, 300ms);
    FAIL() << "no timeout";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("never"), std::string::npos) << e.what();
  }
  // The connection is still usable after a timed-out wait, and a clone talks to the same store.
  EXPECT_EQ(a->get("k"), b("v2"));
  auto clone = a->clone();
  EXPECT_EQ(clone->get("k"), b("v2"));
  EXPECT_EQ(s.server->refused(), 0);
}

TEST(AuthStore, HostedStoreServesOtherThreadsAtOnce) {
  auto host = AuthStore::host("127.0.0.1", 0, "t", 10s);
  // A long wait on one thread must not block a set on another (separate pooled connections).
  std::thread waiter([&] { host->wait({"go"}, 5s); });
  std::this_thread::sleep_for(100ms);
  const auto t0 = std::chrono::steady_clock::now();
  host->set("go", b("1"));
  waiter.join();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
}

TEST(AuthStore, AWrongSecretIsRefusedAndNamed) {
  Server s("right");
  try {
    AuthStore client("127.0.0.1", s.server->port(), "wrong", 5s);
    FAIL() << "a wrong secret was accepted";
  } catch (const CommError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("refused"), std::string::npos) << m;
    EXPECT_NE(m.find("secret"), std::string::npos) << m;
    EXPECT_NE(m.find("127.0.0.1:" + std::to_string(s.server->port())), std::string::npos) << m;
  }
  EXPECT_EQ(s.server->refused(), 1);
  EXPECT_NE(s.joined().find("wrong HMAC"), std::string::npos) << s.joined();
}

// A raw TCP client: what a stranger on the network can do.
struct Raw {
  int fd = -1;
  explicit Raw(uint16_t port) {
    fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(port);
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) throw std::runtime_error("connect");
  }
  ~Raw() { close(fd); }
  void send_bytes(const std::string& s) { (void)!::send(fd, s.data(), s.size(), MSG_NOSIGNAL); }
  // Reads until the server closes the connection (true) or 5 s pass (false).
  bool closed_by_server() {
    char buf[4096];
    const auto end = std::chrono::steady_clock::now() + 5s;
    while (std::chrono::steady_clock::now() < end) {
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, 100) <= 0) continue;
      const ssize_t n = recv(fd, buf, sizeof buf, 0);
      if (n <= 0) return true;
    }
    return false;
  }
};

TEST(AuthStore, AStrangerThatSkipsTheHandshakeIsClosedAndNothingItSentIsActedOn) {
  Server s("secret");
  {
    Raw stranger(s.server->port());
    // A well-formed SET, but sent before (instead of) proving the secret.
    stranger.send_bytes(frame(encode_request({Op::kSet, {"cohort/run_dir"}, {b("/tmp/evil")}, 0})));
    EXPECT_TRUE(stranger.closed_by_server());
  }
  auto client = c10::make_intrusive<AuthStore>("127.0.0.1", s.server->port(), "secret", 5s);
  EXPECT_FALSE(client->check({"cohort/run_dir"}));
  EXPECT_EQ(client->getNumKeys(), 0);
  EXPECT_GE(s.server->refused(), 1);
  EXPECT_NE(s.joined().find("did not complete the handshake"), std::string::npos) << s.joined();
}

TEST(AuthStore, OversizedAndMalformedFramesCloseTheConnectionNotTheServer) {
  Server s("secret");
  {
    Raw big(s.server->port());
    big.send_bytes(std::string("\xff\xff\xff\x7f", 4));  // declares a 2 GiB frame
    EXPECT_TRUE(big.closed_by_server());
  }
  {
    Raw junk(s.server->port());
    junk.send_bytes("GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    EXPECT_TRUE(junk.closed_by_server());
  }
  // An authenticated client that sends a malformed request is closed too; others carry on.
  auto good = c10::make_intrusive<AuthStore>("127.0.0.1", s.server->port(), "secret", 5s);
  good->set("still", b("here"));
  EXPECT_EQ(good->get("still"), b("here"));
  EXPECT_GE(s.server->refused(), 2);
  EXPECT_NE(s.joined().find("over the limit"), std::string::npos) << s.joined();
}

TEST(AuthStore, StrangersHoldingConnectionsOpenCannotLockTheJobOut) {
  Server s("secret");
  // More idle connections than the server keeps waiting for a proof: the oldest strangers are dropped,
  // and the job's own clients still get in at once.
  std::vector<std::unique_ptr<Raw>> idle;
  for (int i = 0; i < 100; ++i) idle.push_back(std::make_unique<Raw>(s.server->port()));
  std::this_thread::sleep_for(200ms);
  const auto t0 = std::chrono::steady_clock::now();
  auto client = c10::make_intrusive<AuthStore>("127.0.0.1", s.server->port(), "secret", 5s);
  client->set("k", b("v"));
  EXPECT_EQ(client->get("k"), b("v"));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
  EXPECT_GE(s.server->refused(), 36);
  EXPECT_NE(s.joined().find("too many connections waiting to prove the secret"), std::string::npos) << s.joined();
}

TEST(AuthStore, AThousandRanksConnectingAtOnceAllGetIn) {
  // Note [A crowd of ranks is not a flood]: 1,024 clients connecting together used to evict each other
  // before any proved the secret, and every one failed. Each thread is a rank: it connects, sets its
  // address, counts itself in, and waits for the last one.
  Server s("secret");
  constexpr int kRanks = 1024;
  std::atomic<int> through{0};
  std::mutex errors_mutex;
  std::string first_error;
  std::vector<std::thread> ranks;
  for (int i = 0; i < kRanks; ++i)
    ranks.emplace_back([&, i] {
      try {
        auto store = c10::make_intrusive<AuthStore>("127.0.0.1", s.server->port(), "secret", 60s);
        store->set("address/" + std::to_string(i), b("10.0.0.1:29500"));
        if (store->add("arrived", 1) == kRanks) store->set("go", b("1"));
        store->get("go");
        ++through;
      } catch (const std::exception& e) {
        std::lock_guard lock(errors_mutex);
        if (first_error.empty()) first_error = e.what();
      }
    });
  for (auto& t : ranks) t.join();
  EXPECT_EQ(through.load(), kRanks) << first_error;
  EXPECT_EQ(s.server->refused(), 0) << s.joined();
}

TEST(AuthStore, AClientThatLeavesMidWaitDoesNotLeaveItsWaitBehind) {
  Server s("secret");
  {
    // By hand: prove the secret, send a WAIT with a long timeout, and hang up while it is pending.
    Raw quitter(s.server->port());
    std::string in;
    char buf[512];
    std::optional<FrameView> f;
    while (!(f = next_frame(in, kMaxFrameBytes))) {
      const ssize_t n = recv(quitter.fd, buf, sizeof buf, 0);
      ASSERT_GT(n, 0);
      in.append(buf, static_cast<size_t>(n));
    }
    const Nonce server_nonce = decode_hello(f->payload);
    const Nonce mine = random_nonce();
    quitter.send_bytes(frame(encode_auth(mine, client_proof("secret", server_nonce, mine))));
    quitter.send_bytes(frame(encode_request({Op::kWait, {"later"}, {}, 2000})));
    std::this_thread::sleep_for(100ms);
  }
  // The next connections may get the same descriptor number: they must never receive that WAIT's answer.
  auto next = c10::make_intrusive<AuthStore>("127.0.0.1", s.server->port(), "secret", 5s);
  next->set("later", b("now"));  // would wake the dead connection's wait
  for (int i = 1; i <= 20; ++i) EXPECT_EQ(next->add("n", 1), i);
  EXPECT_EQ(next->get("later"), b("now"));
}

std::string non_loopback_ipv4() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return {};
  std::string found;
  for (ifaddrs* a = list; a && found.empty(); a = a->ifa_next) {
    if (!a->ifa_addr || a->ifa_addr->sa_family != AF_INET) continue;
    char buf[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, buf, sizeof buf);
    if (std::string(buf).rfind("127.", 0) != 0) found = buf;
  }
  freeifaddrs(list);
  return found;
}

TEST(AuthStore, ListensOnlyOnTheAddressItIsGiven) {
  const std::string other = non_loopback_ipv4();
  if (other.empty()) {
    GTEST_SKIP() << "this machine has no non-loopback IPv4 address to try";
  }
  Server s("secret", "127.0.0.1");
  try {
    AuthStore client(other, s.server->port(), "secret", 1s);
    FAIL() << "the store bound to 127.0.0.1 answered on " << other;
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot reach the rendezvous store at " + other), std::string::npos)
        << e.what();
  }
  // And the other way round: bound to the outside address, it does not answer on loopback.
  Server outside("secret", other);
  EXPECT_THROW(AuthStore("127.0.0.1", outside.server->port(), "secret", 1s), CommError);
  AuthStore ok(other, outside.server->port(), "secret", 5s);
  ok.set("k", b("v"));
}

TEST(AuthStore, APortInUseAndAForeignAddressAreNamed) {
  Server s("x");
  try {
    StoreServer again("127.0.0.1", s.server->port(), "x");
    FAIL();
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("already in use"), std::string::npos) << e.what();
  }
  try {
    StoreServer foreign("192.0.2.1", 0, "x");  // TEST-NET-1: never this machine's
    FAIL();
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("not an address of this machine"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace cohort::store

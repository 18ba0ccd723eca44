// The MLflow run without a server (tests/mlflow has the real one): the buffer holds the params and
// log.mlflow_buffer metrics and counts the rest, and the end gives up on a server that never answered. And log.mlflow
// takes only an http(s) server.
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cohort/config/Config.h"
#include "cohort/log/Mlflow.h"
#include "cohort/util/Error.h"

namespace {

// A loopback port nobody listens on: bound, never listened to, so a connection is refused.
class RefusingPort {
 public:
  RefusingPort() {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    socklen_t n = sizeof a;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &n);
    port_ = ntohs(a.sin_port);
  }
  ~RefusingPort() { ::close(fd_); }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }

 private:
  int fd_ = -1, port_ = 0;
};

}  // namespace

TEST(Mlflow, AServerThatNeverAnswersCostsRecordsNotTheRun) {
  const RefusingPort port;
  cohort::log::MlflowRun run({port.url(), "cohort", "unit", /*buffer=*/5, /*timeout_s=*/1},
                             {{"cohort.strategy", "ddp"}});
  run.params({{"optim.lr", "0.2"}, {"optim.name", "sgd"}});
  for (int step = 1; step <= 10; ++step) run.metric("train/loss", 1.0 / step, step);
  run.drain();
  run.close("FINISHED", {});
  const auto stats = run.stats();
  EXPECT_EQ(stats["sent"], 0);
  EXPECT_EQ(stats["dropped"], 12) << "the 2 params and 5 metrics kept, dropped at the end; 5 metrics past the buffer";
  EXPECT_EQ(stats["run_id"], "");
  EXPECT_EQ(stats["status"], "never made");
  EXPECT_EQ(stats["uri"], port.url());
}

TEST(Mlflow, TheServerMustBeAnHttpUrl) {
  for (const std::string bad : {"file:///tmp/mlruns", "databricks://profile", "127.0.0.1:5000", "http://"}) {
    try {
      cohort::config::load(std::nullopt, {"log.mlflow=" + bad});
      ADD_FAILURE() << bad << " was taken";
    } catch (const cohort::ConfigError& e) {
      EXPECT_NE(e.describe().find("log.mlflow"), std::string::npos) << e.describe();
    }
  }
  EXPECT_EQ(cohort::config::load(std::nullopt, {"log.mlflow=http://127.0.0.1:5000"}).log.mlflow,
            "http://127.0.0.1:5000");
}

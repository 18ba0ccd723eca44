// comm/PeerWatch, which both backends use to say who is missing after a timeout and to compare
// collectives under dist.debug=detail: checked here on a real in-process store, without a backend.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "cohort/comm/FlightRecorder.h"
#include "cohort/comm/PeerWatch.h"
#include "cohort/store/AuthStore.h"
#include "cohort/store/StoreServer.h"
#include "cohort/util/Error.h"

using cohort::comm::CollectiveKind;
using cohort::comm::PeerWatch;

TEST(PeerWatch, NamesTheRankThatNeverIssuedAndThenTheOneThatStoppedBeating) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  PeerWatch me(store, 0, 3);
  auto behind = std::make_unique<PeerWatch>(store, 1, 3);
  PeerWatch alive(store, 2, 3);
  for (int i = 0; i < 5; ++i) me.issue(), alive.issue();
  for (int i = 0; i < 3; ++i) behind->issue();
  EXPECT_EQ(me.issued(), 5u);
  // Everyone beats; rank 1 stopped at collective #3.
  EXPECT_EQ(me.diagnose(5), "rank(s) 1 (last issued #3) never issued it");
  EXPECT_EQ(me.diagnose(3),
            "every rank is alive and has issued collective #3 or a later one: it stalled or broke in the network or "
            "the backend, or the ranks called different collectives at #3 (cohort doctor RUN_DIR compares them)");
  behind.reset();  // its heartbeat stops, as a SIGSTOPped worker's would
  const auto msg = me.diagnose(5);
  EXPECT_NE(msg.find("rank(s) 1 stopped answering (no heartbeat for 2.5 s)"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("rank(s) 2"), std::string::npos) << msg;
}

// `cohort doctor --ask`: a request through the store reaches the rank's heartbeat, which has FlightDumps
// write the record, as SIGUSR2 would (Note [Asking every rank for its record]).
TEST(PeerWatch, ARequestThroughTheStoreHasTheRankWriteItsRecord) {
  const auto dir = std::filesystem::temp_directory_path() / "cohort-peer-watch-ask";
  std::filesystem::remove_all(dir);
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto recorder = std::make_shared<cohort::comm::FlightRecorder>(16);
  recorder->issued(1, "all_reduce", "gradient bucket 0", at::zeros({4}));
  const cohort::comm::FlightDumps dumps(recorder, dir, 1, 2);
  PeerWatch watch(store, 1, 2);
  // Its first beat reads the counter (and creates it): a request from before the rank joined is not one.
  const auto joined = std::chrono::steady_clock::now();
  while (!store->check({"cohort/flight/asked"}) && std::chrono::steady_clock::now() - joined < std::chrono::seconds(30))
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_FALSE(std::filesystem::exists(dir / "flight" / "rank1.json"));
  EXPECT_EQ(cohort::comm::ask_for_flight_records(*store), 1u);
  const auto file = dir / "flight" / "rank1.json";
  const auto asked = std::chrono::steady_clock::now();
  while (!std::filesystem::exists(file) && std::chrono::steady_clock::now() - asked < std::chrono::seconds(30))
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_TRUE(std::filesystem::exists(file));
  const auto record = nlohmann::json::parse(std::ifstream(file));
  EXPECT_EQ(record["reason"], "asked through the store (cohort doctor --ask)");
  EXPECT_EQ(record["entries"].size(), 1u);
  EXPECT_EQ(record["entries"][0]["what"], "gradient bucket 0");
}

// Rank 0 hosts the store and may exit first. A heartbeat that is then inside a store call reconnects
// until the store's timeout; the rank's exit must not wait for it (bench/collectives' rank 1 sat 600 s
// in ~PeerWatch before this).
TEST(PeerWatch, ARankShutsDownAtOnceWhenTheStoreIsAlreadyGone) {
  auto server = std::make_unique<cohort::store::StoreServer>("127.0.0.1", 0, "secret", [](const std::string&) {});
  auto store =
      c10::make_intrusive<cohort::store::AuthStore>("127.0.0.1", server->port(), "secret", std::chrono::minutes(10));
  auto watch = std::make_unique<PeerWatch>(store, 1, 2);
  store->wait({"cohort/beat/1"}, std::chrono::seconds(30));  // it beats
  server.reset();                                            // rank 0 exits
  // The first beat after that fails at once on the broken connection; the next ones reconnect.
  std::this_thread::sleep_for(std::chrono::milliseconds(3500));
  std::promise<void> ended;
  auto shut = ended.get_future();
  std::thread closer([w = watch.release(), p = std::move(ended)]() mutable {
    delete w;
    p.set_value();
  });
  // Bounded by the 2 s ~PeerWatch gives a heartbeat; the store's own timeout is 10 minutes.
  if (shut.wait_for(std::chrono::seconds(60)) == std::future_status::ready) {
    closer.join();
  } else {
    closer.detach();  // so that the failure is reported now, not after the store's timeout
    FAIL() << "~PeerWatch waited for a heartbeat stuck on a store that is gone";
  }
}

TEST(PeerWatch, AMismatchedCollectiveNamesEachRanksCall) {
  const auto x = at::zeros({10});
  auto all = at::stack({cohort::comm::collective_signature(CollectiveKind::kAllReduce, x),
                        cohort::comm::collective_signature(CollectiveKind::kBroadcast, x),
                        cohort::comm::collective_signature(CollectiveKind::kAllReduce, x)});
  try {
    cohort::comm::check_same_collective(all, 0, 7, "bucket 2");
    FAIL() << "a mismatch passed";
  } catch (const cohort::CommError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("collective #7 differs across ranks: rank 0 called all_reduce on 10 x Float ('bucket 2'); "
                     "rank 1 called broadcast on 10 x Float"),
              std::string::npos)
        << m;
    EXPECT_EQ(m.find("rank 2 called"), std::string::npos) << m;
  }
  auto same = at::stack({cohort::comm::collective_signature(CollectiveKind::kBarrier, at::Tensor()),
                         cohort::comm::collective_signature(CollectiveKind::kBarrier, at::Tensor())});
  EXPECT_NO_THROW(cohort::comm::check_same_collective(same, 1, 1, "end"));
}

// comm/PeerWatch, which both backends use to say who is missing after a timeout and to compare
// collectives under dist.debug=detail: checked here on a real in-process store, without a backend.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "cohort/comm/PeerWatch.h"
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
            "every rank is alive and issued it, so the collective itself stalled or broke (network, or the backend)");
  behind.reset();  // its heartbeat stops, as a SIGSTOPped worker's would
  const auto msg = me.diagnose(5);
  EXPECT_NE(msg.find("rank(s) 1 stopped answering (no heartbeat for 2.5 s)"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("rank(s) 2"), std::string::npos) << msg;
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

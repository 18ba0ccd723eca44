#include <gtest/gtest.h>

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <functional>
#include <thread>

#include "cohort/util/Error.h"
#include "unit/ThreadRanks.h"

using cohort::comm::CommunicatorPtr;
using cohort::comm::ReduceOp;
using cohort::testing::run_ranks;

// Closed-form expectations: rank i contributes i.
TEST(GlooCommunicator, CollectivesGiveClosedFormResults) {
  SKIP_WITHOUT_GLOO();
  for (int world : {2, 3}) {
    run_ranks(world, [world](int rank, CommunicatorPtr comm) {
      EXPECT_EQ(comm->rank(), rank);
      EXPECT_EQ(comm->size(), world);
      auto t = at::full({5}, static_cast<float>(rank));
      comm->all_reduce(t, ReduceOp::kSum, "sum")->wait();
      EXPECT_TRUE(t.eq(world * (world - 1) / 2.0f).all().item<bool>());

      auto m = at::full({3}, static_cast<float>(rank));
      comm->all_reduce(m, ReduceOp::kMax, "max")->wait();
      EXPECT_TRUE(m.eq(world - 1.0f).all().item<bool>());

      auto b = at::full({4}, rank == 1 ? 42.0f : -1.0f);
      comm->broadcast(b, 1, "bcast")->wait();
      EXPECT_TRUE(b.eq(42.0f).all().item<bool>());

      auto in = at::full({2}, static_cast<int64_t>(rank), at::kLong);
      auto out = at::zeros({2 * world}, at::kLong);
      comm->all_gather(out, in, "gather")->wait();
      for (int r = 0; r < world; ++r) EXPECT_EQ(out[2 * r].item<int64_t>(), r);

      // Chunk c of rank r holds r*10 + c; rank c receives sum_r (r*10 + c).
      auto rs_in = at::zeros({world * 2});
      for (int c = 0; c < world; ++c) rs_in.narrow(0, 2 * c, 2).fill_(rank * 10 + c);
      auto rs_out = at::zeros({2});
      comm->reduce_scatter(rs_out, rs_in, ReduceOp::kSum, "rs")->wait();
      const float expect = 10.0f * world * (world - 1) / 2 + world * rank;
      EXPECT_TRUE(rs_out.eq(expect).all().item<bool>()) << rs_out;

      comm->barrier("end")->wait();
    });
  }
}

// On LibTorch 1.13 a reduce-scatter and an all-gather are exchanges of pieces (Note [Reduce-scatter and
// all-gather in pieces on LibTorch 1.13]): chunks of several pieces, the last one short, arrive whole and in
// place; two exchanges in flight at once keep their pieces apart; and one is seen to end by polling.
TEST(GlooCommunicator, ChunksOfManyPiecesArriveWholeAndTwoInFlightStayApart) {
  SKIP_WITHOUT_GLOO();
  const int64_t n = 300001;  // 1.2 MB a chunk: pieces of 300 KB, and a last piece of one element
  for (int world : {2, 3})
    run_ranks(world, [&](int rank, CommunicatorPtr comm) {
      auto pattern = at::arange(n, at::kFloat).remainder(997);
      auto rs_in = at::empty({world * n});
      for (int c = 0; c < world; ++c) rs_in.narrow(0, c * n, n).copy_(pattern * (rank + 1) + 10 * rank + c);
      auto rs_out = at::zeros({n});
      auto ag_in = pattern + 1000 * rank;
      auto ag_out = at::zeros({world * n});
      auto rs = comm->reduce_scatter(rs_out, rs_in, ReduceOp::kSum, "rs");
      auto ag = comm->all_gather(ag_out, ag_in, "ag");
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      while (!rs->is_completed() && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      EXPECT_TRUE(rs->is_completed()) << "a reduce-scatter never showed as completed without wait()";
      ag->wait();
      rs->wait();
      // Rank c receives the sum over r of (pattern (r+1) + 10 r + c).
      const int ranks_sum = world * (world - 1) / 2;
      EXPECT_TRUE(rs_out.equal(pattern * (ranks_sum + world) + 10 * ranks_sum + world * rank))
          << "reduce-scatter on rank " << rank << " of " << world;
      for (int r = 0; r < world; ++r)
        EXPECT_TRUE(ag_out.narrow(0, r * n, n).equal(pattern + 1000 * r))
            << "all-gather chunk " << r << " on rank " << rank << " of " << world;
      comm->barrier("end")->wait();
    });
}

// What rank 0's collective says when rank 1 never joins it: rank 1 waits long enough for rank 0 to give up.
std::string error_with_rank_1_absent(const std::function<void(CommunicatorPtr)>& collective) {
  std::string message;
  run_ranks(
      2,
      [&](int rank, CommunicatorPtr comm) {
        if (rank == 1) {
          std::this_thread::sleep_for(std::chrono::milliseconds(2500));
          return;
        }
        try {
          collective(comm);
          ADD_FAILURE() << "a collective with an absent peer returned";
        } catch (const cohort::CommError& e) {
          message = e.what();
        }
      },
      std::chrono::milliseconds(1000));
  return message;
}

TEST(GlooCommunicator, TimeoutNamesCollectiveAndRanks) {
  SKIP_WITHOUT_GLOO();
  const auto start = std::chrono::steady_clock::now();
  std::string message = error_with_rank_1_absent(
      [](CommunicatorPtr comm) { comm->all_reduce(at::ones({4}), ReduceOp::kSum, "gradient bucket 7")->wait(); });
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(message.find("all_reduce 'gradient bucket 7'"), std::string::npos) << message;
  EXPECT_NE(message.find("rank 0 of 2"), std::string::npos) << message;
  EXPECT_NE(message.find("ranks {1}"), std::string::npos) << message;
  EXPECT_LT(s, 10.0);

  // A reduce-scatter in pieces (Note [Reduce-scatter and all-gather in pieces on LibTorch 1.13]) likewise.
  message = error_with_rank_1_absent([](CommunicatorPtr comm) {
    comm->reduce_scatter(at::zeros({200000}), at::ones({400000}), ReduceOp::kSum, "fsdp unit 3")->wait();
  });
  EXPECT_NE(message.find("reduce_scatter 'fsdp unit 3'"), std::string::npos) << message;
  EXPECT_NE(message.find("ranks {1}"), std::string::npos) << message;
}

// dist.debug=detail: a rank that calls another collective, or the same one with another size, is named
// by every rank instead of hanging or mixing unrelated data.
TEST(GlooCommunicator, DebugModeNamesAMismatchedCollective) {
  SKIP_WITHOUT_GLOO();
  for (int variant = 0; variant < 2; ++variant) {
    std::vector<std::string> errors(2);
    cohort::testing::run_ranks(2, [&](int rank, cohort::comm::CommunicatorPtr comm) {
      comm->set_debug(true);
      comm->all_reduce(at::ones({4}), cohort::comm::ReduceOp::kSum, "matched")->wait();  // a matching one passes
      try {
        if (rank == 1 && variant == 0)
          comm->all_reduce(at::ones({12}), cohort::comm::ReduceOp::kSum, "grads")->wait();
        else if (rank == 1)
          comm->broadcast(at::ones({10}), 0, "weights")->wait();
        else
          comm->all_reduce(at::ones({10}), cohort::comm::ReduceOp::kSum, "grads")->wait();
      } catch (const cohort::CommError& e) {
        errors[rank] = e.what();
      }
    });
    const std::string other =
        variant == 0 ? "rank 1 called all_reduce on 12 x Float" : "rank 1 called broadcast on 10 x Float";
    EXPECT_NE(errors[0].find("differs across ranks: rank 0 called all_reduce on 10 x Float ('grads')"),
              std::string::npos)
        << errors[0];
    EXPECT_NE(errors[0].find(other), std::string::npos) << errors[0];
    EXPECT_NE(errors[1].find("rank 0 called all_reduce on 10 x Float"), std::string::npos) << errors[1];
  }
}

// Note [A write to a dead rank must not kill this one]: once a Gloo communicator exists, a write to a
// socket whose reader has gone (what Gloo's writev meets when a rank dies) fails with EPIPE rather than
// ending this process with SIGPIPE, which would take this whole test binary down.
TEST(GlooCommunicator, AWriteToARankThatIsGoneFailsInsteadOfEndingTheProcess) {
  SKIP_WITHOUT_GLOO();
  run_ranks(1, [](int, CommunicatorPtr) {});
  int fds[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  close(fds[1]);
  const char byte = 1;
  errno = 0;
  EXPECT_EQ(::write(fds[0], &byte, 1), -1);
  EXPECT_EQ(errno, EPIPE);
  close(fds[0]);
}

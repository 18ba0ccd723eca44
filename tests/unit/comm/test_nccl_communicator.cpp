// The NCCL backend on one GPU: world size 1 over an in-process store, where every collective has a
// closed form (all-reduce, broadcast and reduce-scatter leave the data as it is, all-gather copies it).
// Built only with COHORT_CUDA (tests/CMakeLists.txt leaves this file out otherwise); each test skips,
// saying why, where no CUDA device is visible. `make check-cuda` compiles and links it.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/cuda.h>
#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "cohort/comm/FlightRecorder.h"
#include "cohort/comm/NcclCommunicator.h"
#include "cohort/util/Error.h"

namespace {

using cohort::CommError;
using cohort::comm::ReduceOp;

class NcclCommunicatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) {
      GTEST_SKIP() << "no CUDA device visible (torch::cuda::is_available() is false): the NCCL backend needs one";
    }
    comm_ = cohort::comm::NcclCommunicator::create(c10::make_intrusive<c10d::HashStore>(), 0, 1, 0,
                                                   std::chrono::seconds(60));
  }

  at::Tensor cuda_arange(int64_t n, at::ScalarType dtype = at::kFloat) const {
    return at::arange(n, at::TensorOptions().dtype(dtype).device(at::kCUDA, 0));
  }

  cohort::comm::CommunicatorPtr comm_;
};

TEST_F(NcclCommunicatorTest, DescribesItself) {
  EXPECT_EQ(comm_->rank(), 0);
  EXPECT_EQ(comm_->size(), 1);
  EXPECT_EQ(comm_->backend_name(), "nccl");
  EXPECT_EQ(comm_->timeout(), std::chrono::seconds(60));
}

TEST_F(NcclCommunicatorTest, AllReduceOfOneRankIsTheIdentity) {
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin}) {
    auto t = cuda_arange(1000);
    const auto expect = t.clone();
    comm_->all_reduce(t, op, "identity")->wait();
    EXPECT_TRUE(t.equal(expect)) << "op " << static_cast<int>(op);
  }
}

TEST_F(NcclCommunicatorTest, AllReduceCarriesEveryDtype) {
  for (auto dtype : {at::kFloat, at::kHalf, at::kBFloat16, at::kDouble, at::kInt, at::kLong, at::kByte}) {
    auto t = cuda_arange(100, dtype);  // 0..99 is exact in every one of these types
    const auto expect = t.clone();
    comm_->all_reduce(t, ReduceOp::kSum, "dtype")->wait();
    EXPECT_TRUE(t.equal(expect)) << c10::toString(dtype);
  }
}

TEST_F(NcclCommunicatorTest, BroadcastAllGatherReduceScatter) {
  auto b = cuda_arange(7);
  comm_->broadcast(b, 0, "bcast")->wait();
  EXPECT_TRUE(b.equal(cuda_arange(7)));

  auto in = cuda_arange(5, at::kLong);
  auto out = at::zeros_like(in);
  comm_->all_gather(out, in, "gather")->wait();
  EXPECT_TRUE(out.equal(in));

  auto rs_in = cuda_arange(6);
  auto rs_out = at::zeros({6}, rs_in.options());
  comm_->reduce_scatter(rs_out, rs_in, ReduceOp::kSum, "rs")->wait();
  EXPECT_TRUE(rs_out.equal(rs_in));

  // In place: the output is rank 0's chunk of the input (the whole input, with one rank).
  auto whole = cuda_arange(6);
  comm_->reduce_scatter(whole.narrow(0, 0, 6), whole, ReduceOp::kSum, "rs in place")->wait();
  EXPECT_TRUE(whole.equal(cuda_arange(6)));
}

TEST_F(NcclCommunicatorTest, BarrierBlocksTheHostUntilDone) {
  auto h = comm_->barrier("end");
  h->wait();
  EXPECT_TRUE(h->is_completed());
}

// Note [The NCCL communicator's flight record]: every collective is in the record with its purpose, type
// and size, and completed once the watchdog has seen its end event (it polls every 100 ms).
TEST_F(NcclCommunicatorTest, RecordsEachCollectiveForTheDoctor) {
  auto t = cuda_arange(8);
  comm_->all_reduce(t, ReduceOp::kSum, "gradient bucket 0")->wait();
  comm_->barrier("end of training")->wait();
  ASSERT_NE(comm_->flight(), nullptr);
  nlohmann::json record;
  for (int i = 0; i < 50; ++i) {
    record = comm_->flight()->to_json(0, 1, "test");
    if (record["entries"].size() == 2 && record["entries"][1]["state"] == "completed") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_EQ(record["entries"].size(), 2u) << record.dump(1);
  EXPECT_EQ(record["entries"][0]["op"], "all_reduce");
  EXPECT_EQ(record["entries"][0]["what"], "gradient bucket 0");
  EXPECT_EQ(record["entries"][0]["dtype"], "Float");
  EXPECT_EQ(record["entries"][0]["numel"], 8);
  EXPECT_EQ(record["entries"][0]["state"], "completed");
  EXPECT_EQ(record["entries"][1]["op"], "barrier");
  EXPECT_EQ(record["entries"][1]["state"], "completed") << record.dump(1);
}

// The collective is ordered after the caller's current stream and before what follows on it, also when
// that stream is not the default one (see Note [Sync streams and recordStream]).
TEST_F(NcclCommunicatorTest, FollowsTheCurrentStream) {
  c10::cuda::CUDAStreamGuard side(c10::cuda::getStreamFromPool(false, 0));
  auto t = at::ones({1 << 20}, at::TensorOptions().device(at::kCUDA, 0)).mul_(3);
  comm_->all_reduce(t, ReduceOp::kSum, "side stream")->wait();
  t.add_(1);
  EXPECT_EQ(t.sum().item<float>(), 4.0f * (1 << 20));
}

TEST_F(NcclCommunicatorTest, RejectsTensorsItCannotCarry) {
  auto expect_comm_error = [](const std::function<void()>& f, const std::string& needle) {
    try {
      f();
      ADD_FAILURE() << "no CommError; expected one mentioning '" << needle << "'";
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_FALSE(e.hint().empty()) << e.what();
    }
  };
  expect_comm_error([&] { comm_->all_reduce(cuda_arange(12).view({3, 4}).t(), ReduceOp::kSum, "t"); }, "contiguous");
  expect_comm_error([&] { comm_->broadcast(cuda_arange(4).to(at::kBool), 0, "mask"); }, "Bool");
  // A rejected tensor is the caller's mistake, not a broken communicator: it still works.
  auto t = cuda_arange(3);
  comm_->all_reduce(t, ReduceOp::kSum, "after")->wait();
  EXPECT_TRUE(t.equal(cuda_arange(3)));
}

// Note [Host tensors through NCCL]: the trainer's metric sums and flags are host tensors. They are
// staged through the GPU, and their wait() returns with the result back on the host.
TEST_F(NcclCommunicatorTest, HostTensorsAreStagedThroughTheDevice) {
  auto sums = at::arange(4, at::kDouble);
  comm_->all_reduce(sums, ReduceOp::kSum, "metric sums")->wait();
  EXPECT_TRUE(sums.is_cpu());
  EXPECT_TRUE(sums.equal(at::arange(4, at::kDouble)));
  auto gathered = at::zeros({3}, at::kLong);
  comm_->all_gather(gathered, at::full({3}, 7, at::kLong), "bad file counts")->wait();
  EXPECT_TRUE(gathered.equal(at::full({3}, 7, at::kLong)));
  auto mixed = at::zeros({4});  // a host output of a device input
  comm_->all_gather(mixed, cuda_arange(4), "host output")->wait();
  EXPECT_TRUE(mixed.equal(at::arange(4, at::kFloat)));
  auto flag = at::full({1}, 1.0, at::kDouble);
  comm_->all_reduce(flag, ReduceOp::kMax, "inf/NaN gradient flag")->wait();
  EXPECT_EQ(flag.item<double>(), 1.0);
}

// Rank 1 never starts: rank 0's setup must end in a CommError after the timeout, not hang in NCCL's
// bootstrap (the nonblocking init is what makes it abortable).
TEST(NcclCommunicator, SetupWithoutThePeersTimesOut) {
  if (!torch::cuda::is_available()) {
    GTEST_SKIP() << "no CUDA device visible";
  }
  const auto start = std::chrono::steady_clock::now();
  try {
    cohort::comm::NcclCommunicator::create(c10::make_intrusive<c10d::HashStore>(), 0, 2, 0, std::chrono::seconds(2));
    ADD_FAILURE() << "setup with a missing rank succeeded";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0 of 2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("within 2 s"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
}

}  // namespace

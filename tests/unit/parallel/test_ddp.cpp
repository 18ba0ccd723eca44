// DDP against a single-process reference on the same global batch, with ranks as threads over Gloo.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "cohort/optim/Sgd.h"
#include "cohort/parallel/ddp/DistributedDataParallel.h"
#include "cohort/util/Error.h"
#include "unit/ThreadRanks.h"

using cohort::comm::CommunicatorPtr;
using cohort::parallel::ddp::DdpOptions;
using cohort::parallel::ddp::DistributedDataParallel;
using cohort::testing::run_ranks;

namespace {

// No batch norm: with it, per-shard statistics would differ from the full batch's by design.
struct NetImpl : torch::nn::Module {
  NetImpl(int64_t width, bool with_unused = false)
      : conv(register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 4, 3).padding(1)))),
        fc1(register_module("fc1", torch::nn::Linear(4 * 8 * 8, width))),
        fc2(register_module("fc2", torch::nn::Linear(width, 10))) {
    if (with_unused) unused = register_module("unused", torch::nn::Linear(3, 3));
  }
  at::Tensor forward(at::Tensor x) {
    x = torch::relu(conv(x)).flatten(1);
    return fc2(torch::tanh(fc1(x)));
  }
  torch::nn::Conv2d conv;
  torch::nn::Linear fc1, fc2;
  torch::nn::Linear unused{nullptr};
};
TORCH_MODULE(Net);

constexpr int64_t kGlobalBatch = 12;
constexpr int kSteps = 12;

using Data = cohort::testing::Batch;
// The global generator is shared by the rank threads, so all random data is drawn up front, serially.
const std::vector<Data>& all_data() {
  static const std::vector<Data> data = cohort::testing::random_batches(kSteps, kGlobalBatch, 1000);
  return data;
}
Data make_data(int step) { return all_data()[step]; }

// Models are built before the rank threads start, for the same reason.
std::vector<Net> make_nets(int world, int64_t width, bool with_unused = false) {
  std::vector<Net> nets;
  for (int r = 0; r < world; ++r) {
    torch::manual_seed(r == 0 ? 7 : 100 + r);  // different init on purpose: DDP must broadcast rank 0's
    nets.push_back(Net(width, with_unused));
  }
  return nets;
}

at::Tensor flat_params(torch::nn::Module& m) {
  std::vector<at::Tensor> ps;
  for (auto& p : m.parameters()) ps.push_back(p.detach().reshape(-1));
  return torch::cat(ps).clone();
}

cohort::optim::Sgd make_sgd(torch::nn::Module& m) {
  return cohort::optim::Sgd(cohort::optim::split_decay(m.named_parameters(), 1e-3, false), {0.9, true});
}

// One process, the whole global batch: the reference every strategy must match.
std::vector<at::Tensor> reference_run() {
  torch::manual_seed(7);
  Net net(16);
  auto opt = make_sgd(*net);
  std::vector<at::Tensor> out;
  for (int s = 0; s < kSteps; ++s) {
    auto d = make_data(s);
    auto loss = torch::nn::functional::cross_entropy(net->forward(d.x), d.y);
    loss.backward();
    opt.step(0.05);
    opt.zero_grad();
    out.push_back(flat_params(*net));
  }
  return out;
}

// W ranks, each on its contiguous shard of the same global batch.
std::vector<std::vector<at::Tensor>> ddp_run(int world, DdpOptions options, int accum = 1) {
  std::vector<std::vector<at::Tensor>> per_rank(world);
  make_data(0);
  auto nets = make_nets(world, 16);
  run_ranks(world, [&](int rank, CommunicatorPtr comm) {
    Net net = nets[rank];
    DistributedDataParallel ddp(net.ptr(), comm, options);
    auto opt = make_sgd(*net);
    const int64_t shard = kGlobalBatch / world;
    for (int s = 0; s < kSteps; ++s) {
      auto d = make_data(s);
      auto x = d.x.narrow(0, rank * shard, shard), y = d.y.narrow(0, rank * shard, shard);
      const int64_t micro = shard / accum;
      for (int m = 0; m < accum; ++m) {
        std::unique_ptr<DistributedDataParallel::NoSync> guard;  // (gcc 12 misreads a std::optional of it)
        if (m + 1 < accum) guard = std::make_unique<DistributedDataParallel::NoSync>(ddp.no_sync());
        auto loss = torch::nn::functional::cross_entropy(net->forward(x.narrow(0, m * micro, micro)),
                                                         y.narrow(0, m * micro, micro));
        (loss / accum).backward();
      }
      opt.step(0.05);
      opt.zero_grad();
      per_rank[rank].push_back(flat_params(*net));
    }
  });
  return per_rank;
}

void expect_parity(const std::vector<at::Tensor>& ref, const std::vector<std::vector<at::Tensor>>& ranks) {
  for (int s = 0; s < kSteps; ++s) {
    for (size_t r = 0; r < ranks.size(); ++r) {
      // Bitwise identical across ranks: every rank applies the same averaged gradient.
      EXPECT_TRUE(torch::equal(ranks[r][s], ranks[0][s])) << "step " << s << " rank " << r;
    }
    const double rel = ((ranks[0][s] - ref[s]).norm() / ref[s].norm()).item<double>();
    EXPECT_LT(rel, 2e-6) << "step " << s;
    EXPECT_TRUE(torch::allclose(ranks[0][s], ref[s], /*rtol=*/1e-4, /*atol=*/1e-6)) << "step " << s;
  }
}

DdpOptions small_buckets() {
  DdpOptions o;
  o.bucket_mb = 2.0 / 1024;  // ~2 KiB: several buckets, so ordering and overlap matter
  o.first_bucket_mb = 0.5 / 1024;
  return o;
}

}  // namespace

TEST(Ddp, MatchesSingleProcessReferenceWithTwoAndThreeRanks) {
  SKIP_WITHOUT_GLOO();
  const auto ref = reference_run();
  expect_parity(ref, ddp_run(2, small_buckets()));
  expect_parity(ref, ddp_run(3, small_buckets()));
  expect_parity(ref, ddp_run(2, DdpOptions{}));  // one big bucket
}

TEST(Ddp, NoSyncAccumulationMatchesReference) {
  SKIP_WITHOUT_GLOO();
  expect_parity(reference_run(), ddp_run(2, small_buckets(), /*accum=*/2));
}

TEST(Ddp, AllReduceStartsBeforeBackwardEnds) {
  SKIP_WITHOUT_GLOO();
  make_data(0);
  auto nets = make_nets(2, 256);
  run_ranks(2, [&](int rank, CommunicatorPtr comm) {
    Net net = nets[rank];
    DistributedDataParallel ddp(net.ptr(), comm, small_buckets());
    ASSERT_GT(ddp.reducer().plan().size(), 2u);
    auto d = make_data(0);
    torch::nn::functional::cross_entropy(net->forward(d.x), d.y).backward();
    const auto& trace = ddp.reducer().last_trace();
    ASSERT_EQ(trace.bucket_launch_s.size(), ddp.reducer().plan().size());
    // The first bucket went out while later gradients were still being computed.
    EXPECT_LT(trace.bucket_launch_s.front(), trace.last_hook_s);
    EXPECT_LE(trace.last_hook_s, trace.finalize_s);
  });
}

TEST(Ddp, WithoutOverlapEveryBucketLaunchesAfterBackward) {
  SKIP_WITHOUT_GLOO();
  make_data(0);
  auto nets = make_nets(2, 64);
  run_ranks(2, [&](int rank, CommunicatorPtr comm) {
    Net net = nets[rank];
    auto o = small_buckets();
    o.overlap = false;
    DistributedDataParallel ddp(net.ptr(), comm, o);
    auto d = make_data(0);
    torch::nn::functional::cross_entropy(net->forward(d.x), d.y).backward();
    for (double t : ddp.reducer().last_trace().bucket_launch_s) EXPECT_GE(t, ddp.reducer().last_trace().last_hook_s);
  });
}

TEST(Ddp, UnusedParameterIsNamedOrReducedAsZero) {
  SKIP_WITHOUT_GLOO();
  make_data(0);
  auto nets = make_nets(2, 16, /*with_unused=*/true);
  run_ranks(2, [&](int rank, CommunicatorPtr comm) {
    Net net = nets[rank];
    DistributedDataParallel ddp(net.ptr(), comm, DdpOptions{});
    auto d = make_data(0);
    try {
      torch::nn::functional::cross_entropy(net->forward(d.x), d.y).backward();
      ADD_FAILURE() << "backward with an unused parameter did not fail";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("unused.weight"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("find_unused_parameters"), std::string::npos) << e.what();
    }
  });
  auto nets2 = make_nets(2, 16, /*with_unused=*/true);
  run_ranks(2, [&](int rank, CommunicatorPtr comm) {
    Net net = nets2[rank];
    DdpOptions o;
    o.find_unused_parameters = true;
    DistributedDataParallel ddp(net.ptr(), comm, o);
    auto d = make_data(0);
    torch::nn::functional::cross_entropy(net->forward(d.x), d.y).backward();
    ASSERT_TRUE(net->unused->weight.grad().defined());
    EXPECT_EQ(net->unused->weight.grad().abs().sum().item<float>(), 0.0f);
    EXPECT_GT(net->fc1->weight.grad().abs().sum().item<float>(), 0.0f);
  });
}

TEST(Ddp, ReplicaMismatchNamesRankAndParameter) {
  SKIP_WITHOUT_GLOO();
  std::vector<std::string> messages(2);
  std::vector<Net> nets{Net(16), Net(32)};
  run_ranks(2, [&](int rank, CommunicatorPtr comm) {
    Net net = nets[rank];
    try {
      DistributedDataParallel ddp(net.ptr(), comm);
    } catch (const cohort::CommError& e) {
      messages[rank] = e.what();
    }
  });
  for (const auto& m : messages) {
    EXPECT_NE(m.find("on rank 1"), std::string::npos) << m;
    EXPECT_NE(m.find("fc1.weight"), std::string::npos) << m;
    EXPECT_NE(m.find("[32,256]"), std::string::npos) << m;
  }
}

TEST(Ddp, BuffersFollowRankZero) {
  SKIP_WITHOUT_GLOO();
  std::vector<torch::nn::Sequential> nets;
  std::vector<at::Tensor> inputs;
  for (int r = 0; r < 2; ++r) {
    torch::manual_seed(7);
    nets.push_back(
        torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 2, 3)), torch::nn::BatchNorm2d(2)));
    inputs.push_back(torch::randn({4, 1, 6, 6}) * (r + 1));  // each rank sees different data
  }
  run_ranks(2, [&](int rank, CommunicatorPtr comm) {
    auto bn = nets[rank];
    DistributedDataParallel ddp(bn.ptr(), comm);
    // Two steps: the broadcast launched when backward begins must land every time, overwriting what
    // this rank's own forward computed.
    for (int step = 0; step < 2; ++step) {
      auto out = bn->forward(inputs[rank] + step);
      auto own = bn->named_buffers()["1.running_mean"].clone();
      out.sum().backward();
      auto mean = bn->named_buffers()["1.running_mean"].clone();
      auto all = torch::zeros({2, 2});
      comm->all_gather(all, mean, "check")->wait();
      EXPECT_TRUE(torch::equal(all[0], all[1])) << all;
      if (rank == 0) {
        EXPECT_TRUE(torch::equal(mean, own));
      }
      if (rank == 1) {
        EXPECT_FALSE(torch::equal(mean, own)) << "rank 1 kept its own statistics";
      }
    }
  });
}

// Gradient compression hooks (fp16/bf16, PowerSGD) with ranks as threads over real Gloo: exactness where
// the approximation can be exact, the error-feedback identity, identical results on every rank, the
// bytes they send, and checkpoint state that resumes bit for bit.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "cohort/parallel/compress/LowPrecisionHook.h"
#include "cohort/parallel/compress/PowerSgd.h"
#include "cohort/parallel/ddp/DistributedDataParallel.h"
#include "unit/ThreadRanks.h"

using namespace cohort;
using cohort::testing::run_ranks;

namespace {

// One bucket holding gradients of the given shapes, as the reducer builds it.
parallel::ddp::GradBucket make_bucket(const std::vector<std::vector<int64_t>>& shapes) {
  parallel::ddp::GradBucket b;
  int64_t total = 0;
  for (const auto& s : shapes) total += c10::multiply_integers(s);
  b.buffer = at::zeros({total});
  int64_t offset = 0;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const int64_t n = c10::multiply_integers(shapes[i]);
    b.grads.push_back(b.buffer.narrow(0, offset, n).view(shapes[i]));
    b.names.push_back("p" + std::to_string(i));
    offset += n;
  }
  return b;
}

// What rank `rank` contributes at `step`: deterministic, different per rank and step, and computable by
// every rank (no shared generator between the rank threads).
at::Tensor gradient(int rank, int step, int64_t numel) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 * step + rank + 1);
  return at::randn({numel}, gen);
}

at::Tensor average(int world, int step, int64_t numel) {
  auto sum = at::zeros({numel});
  for (int r = 0; r < world; ++r) sum += gradient(r, step, numel);
  return sum / world;
}

// Runs one synchronized step of `hook` on `bucket` filled with this rank's gradient.
void step_hook(parallel::ddp::CommHook& hook, comm::Communicator& comm, parallel::ddp::GradBucket& bucket, int step) {
  bucket.buffer.copy_(gradient(comm.rank(), step, bucket.buffer.numel()));
  hook.run(comm, bucket)->wait();
  hook.end_of_backward();
}

void expect_same_on_every_rank(comm::Communicator& comm, const at::Tensor& t) {
  auto all = at::zeros({comm.size(), t.numel()});
  comm.all_gather(all, t.reshape(-1).contiguous(), "check")->wait();
  for (int r = 1; r < comm.size(); ++r) EXPECT_TRUE(at::equal(all[0], all[r])) << "rank " << r << " differs";
}

const std::vector<std::vector<int64_t>> kShapes{{6, 4}, {5}, {3, 2, 2, 2}, {16, 12}};

}  // namespace

TEST(PowerSgdPlan, CompressesOnlyWhereItPays) {
  parallel::compress::PowerSgdOptions o;
  o.rank = 2;
  const auto plan = parallel::compress::plan_matrices({{64, 32, 3, 3}, {10}, {4, 4}, {0}}, o);
  ASSERT_EQ(plan.size(), 4u);
  EXPECT_EQ(plan[0].n, 64);
  EXPECT_EQ(plan[0].m, 288);  // conv kernels as [out, in * kh * kw]
  EXPECT_EQ(plan[0].r, 2);
  EXPECT_TRUE(plan[0].compress);
  EXPECT_FALSE(plan[1].compress);  // a vector never pays
  EXPECT_FALSE(plan[2].compress);  // (4 + 4) x 2 x 2 >= 16
  EXPECT_FALSE(plan[3].compress);
  EXPECT_EQ(parallel::compress::compressed_numel(plan), (64 + 288) * 2 + 10 + 16);
  o.min_compression_rate = 0.5;
  EXPECT_TRUE(parallel::compress::plan_matrices({{4, 4}}, o)[0].compress);
  o.rank = 100;  // the rank is capped by the matrix
  EXPECT_EQ(parallel::compress::plan_matrices({{6, 4}}, o)[0].r, 4);
}

TEST(PowerSgd, EqualsPlainAllReduceWhenRankCoversTheMatrix) {
  SKIP_WITHOUT_GLOO();
  for (int world : {2, 3}) {
    run_ranks(world, [&](int rank, comm::CommunicatorPtr comm) {
      parallel::compress::PowerSgdOptions o;
      o.rank = 16;  // >= every smaller dimension
      o.start_iter = 0;
      o.min_compression_rate = 0;  // compress everything, vectors too (as n x 1)
      parallel::compress::PowerSgdHook hook(o);
      auto bucket = make_bucket(kShapes);
      hook.attach({bucket}, *comm);
      for (int step = 0; step < 3; ++step) {
        step_hook(hook, *comm, bucket, step);
        const auto expected = average(world, step, bucket.buffer.numel());
        EXPECT_TRUE(at::allclose(bucket.buffer, expected, 1e-4, 1e-5))
            << "world " << world << " step " << step << " max error "
            << (bucket.buffer - expected).abs().max().item<float>();
        expect_same_on_every_rank(*comm, bucket.buffer);
      }
    });
  }
}

TEST(PowerSgd, ErrorFeedbackKeepsWhatCompressionDropped) {
  SKIP_WITHOUT_GLOO();
  run_ranks(3, [&](int rank, comm::CommunicatorPtr comm) {
    parallel::compress::PowerSgdOptions o;
    o.rank = 1;
    o.start_iter = 0;
    parallel::compress::PowerSgdHook hook(o);
    auto bucket = make_bucket(kShapes);
    hook.attach({bucket}, *comm);
    auto residual = at::zeros({bucket.buffer.numel()});
    for (int step = 0; step < 4; ++step) {
      const auto g = gradient(rank, step, bucket.buffer.numel());
      step_hook(hook, *comm, bucket, step);
      const auto& err = hook.error(0);
      // This rank: compressed average + new residual = its gradient + the residual it carried in.
      EXPECT_TRUE(at::allclose(bucket.buffer + err, g + residual, 1e-5, 1e-5)) << "step " << step;
      // Across ranks: compressed average + mean residual = the true average of what was sent.
      auto sent = (g + residual).clone(), kept = err.clone();
      comm->all_reduce(sent, comm::ReduceOp::kSum, "check sent")->wait();
      comm->all_reduce(kept, comm::ReduceOp::kSum, "check kept")->wait();
      EXPECT_TRUE(at::allclose(bucket.buffer + kept / 3, sent / 3, 1e-5, 1e-5)) << "step " << step;
      // Rank 1 compression loses something: the residual is not zero for the compressed matrices.
      EXPECT_GT(err.abs().sum().item<float>(), 0.0f);
      expect_same_on_every_rank(*comm, bucket.buffer);
      residual = err.clone();
    }
  });
}

TEST(PowerSgd, PlainAllReduceBeforeStartIterThenFewerBytes) {
  SKIP_WITHOUT_GLOO();
  run_ranks(2, [&](int rank, comm::CommunicatorPtr comm) {
    parallel::compress::PowerSgdOptions o;
    o.rank = 1;
    o.start_iter = 2;
    parallel::compress::PowerSgdHook hook(o);
    auto bucket = make_bucket(kShapes);
    hook.attach({bucket}, *comm);
    const int64_t dense = bucket.buffer.numel() * 4;
    for (int step = 0; step < 2; ++step) {
      step_hook(hook, *comm, bucket, step);
      EXPECT_EQ(bucket.wire_bytes, dense);
      EXPECT_TRUE(at::allclose(bucket.buffer, average(2, step, bucket.buffer.numel()), 1e-6, 1e-6));
    }
    step_hook(hook, *comm, bucket, 2);
    const auto plan = parallel::compress::plan_matrices(kShapes, o);
    EXPECT_EQ(bucket.wire_bytes, parallel::compress::compressed_numel(plan) * 4);
    EXPECT_LT(bucket.wire_bytes, dense);
  });
}

TEST(PowerSgd, StateDictResumesBitForBit) {
  SKIP_WITHOUT_GLOO();
  run_ranks(2, [&](int rank, comm::CommunicatorPtr comm) {
    parallel::compress::PowerSgdOptions o;
    o.rank = 2;
    o.start_iter = 1;
    parallel::compress::PowerSgdHook original(o);
    auto a = make_bucket(kShapes);
    original.attach({a}, *comm);
    for (int step = 0; step < 3; ++step) step_hook(original, *comm, a, step);
    const auto state = original.state_dict(*comm);

    parallel::compress::PowerSgdHook resumed(o);
    auto b = make_bucket(kShapes);
    resumed.attach({b}, *comm);
    resumed.load_state_dict(state, *comm);
    EXPECT_EQ(resumed.iteration(), 3);
    for (int step = 3; step < 5; ++step) {
      step_hook(original, *comm, a, step);
      step_hook(resumed, *comm, b, step);
      EXPECT_TRUE(at::equal(a.buffer, b.buffer)) << "step " << step;
    }
  });
}

TEST(LowPrecisionHook, AveragesInSixteenBitsAndSendsHalfTheBytes) {
  SKIP_WITHOUT_GLOO();
  for (auto dtype : {at::kHalf, at::kBFloat16}) {
    run_ranks(3, [&](int rank, comm::CommunicatorPtr comm) {
      parallel::compress::LowPrecisionHook hook(dtype);
      auto bucket = make_bucket(kShapes);
      hook.attach({bucket}, *comm);
      step_hook(hook, *comm, bucket, 0);
      const auto expected = average(3, 0, bucket.buffer.numel());
      const double tol = dtype == at::kHalf ? 2e-3 : 2e-2;
      EXPECT_TRUE(at::allclose(bucket.buffer, expected, tol, tol)) << hook.name();
      EXPECT_EQ(bucket.wire_bytes, bucket.buffer.numel() * 2);
      expect_same_on_every_rank(*comm, bucket.buffer);
    });
  }
}

TEST(PowerSgd, DdpRanksEndEveryStepWithIdenticalParameters) {
  SKIP_WITHOUT_GLOO();
  std::vector<torch::nn::Sequential> nets;
  for (int r = 0; r < 2; ++r) {
    torch::manual_seed(r);
    nets.push_back(torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 8, 3)), torch::nn::ReLU(),
                                         torch::nn::Flatten(), torch::nn::Linear(8 * 6 * 6, 10)));
  }
  std::vector<at::Tensor> inputs;
  for (int i = 0; i < 2 * 6; ++i) inputs.push_back(torch::randn({4, 1, 8, 8}));
  run_ranks(2, [&](int rank, comm::CommunicatorPtr comm) {
    auto net = nets[rank];
    parallel::ddp::DdpOptions opts;
    opts.bucket_mb = 0.001;  // several buckets
    opts.first_bucket_mb = 0.001;
    parallel::ddp::DistributedDataParallel ddp(net.ptr(), comm, opts);
    parallel::compress::PowerSgdOptions o;
    o.rank = 2;
    o.start_iter = 2;
    ddp.set_comm_hook(std::make_shared<parallel::compress::PowerSgdHook>(o));
    torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    for (int step = 0; step < 6; ++step) {
      opt.zero_grad();
      net->forward(inputs[2 * step + rank]).pow(2).mean().backward();
      opt.step();
      for (const auto& p : net->parameters()) expect_same_on_every_rank(*comm, p.detach());
    }
    EXPECT_LT(ddp.reducer().last_trace().bytes_reduced, ddp.reducer().last_trace().bytes_dense);
  });
}

// optim.in_backward under ddp: each bucket stepped as its all-reduce ends (Note [The optimizer inside
// backward] in parallel/Strategy.cpp), against the plain step after backward on the same global batches,
// with ranks as threads over Gloo. About 10 s in all on 2 cores.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <thread>

#include <torch/torch.h>

#include "cohort/config/Config.h"
#include "cohort/models/Models.h"
#include "cohort/parallel/Strategy.h"
#include "cohort/train/AutoSettings.h"
#include "cohort/util/Error.h"
#include "unit/ThreadRanks.h"

using cohort::CommunicatorPtr;
using cohort::TrainConfig;
using cohort::testing::run_ranks;

namespace {

constexpr int64_t kGlobalBatch = 12;  // divides by 2 and 3
constexpr int kSteps = 50;

const std::vector<cohort::testing::Batch>& all_data() {
  static const auto data = cohort::testing::random_batches(kSteps, kGlobalBatch, 4100);
  return data;
}

struct Spec {
  bool in_backward = false;
  std::string optimizer = "sgd";
  std::string compress = "none";
  int world = 2;
  int accum = 1;
  int steps = kSteps;
  bool announce = true;  // call prepare_step before the last micro-batch's backward, as the loop does
  // Both runs with the same small last bucket. Else in_backward plans one and the plain step does not:
  // another summation order in a ring of 3 or more ranks (bitwise the same on 2).
  bool same_plan = true;
};

TrainConfig config_for(const Spec& spec) {
  TrainConfig cfg;
  cfg.model.name = "resnet8";
  cfg.model.width = 4;
  cfg.dist.bucket_mb = 0.004;  // ~1000 floats: several buckets
  cfg.dist.first_bucket_mb = 0.002;
  cfg.dist.compress = spec.compress;
  if (spec.same_plan) cfg.dist.last_bucket_mb = 0.002;
  cfg.optim.name = spec.optimizer;
  cfg.optim.lr = spec.optimizer == "adamw" ? 0.003 : 0.05;
  cfg.optim.weight_decay = spec.optimizer == "adamw" ? 0.05 : 5e-4;
  cfg.optim.in_backward = spec.in_backward;
  return cfg;
}

// Rank 0's parameters after the run (every rank's are equal: checked), then its optimizer state as a
// checkpoint holds it.
std::vector<at::Tensor> train(const Spec& spec) {
  const auto cfg = config_for(spec);
  std::vector<std::shared_ptr<cohort::models::Classifier>> models;
  for (int r = 0; r < spec.world; ++r) {
    torch::manual_seed(r == 0 ? 17 : 500 + r);
    models.push_back(cohort::models::build(cfg.model, 1, 8));
  }
  std::vector<std::vector<at::Tensor>> params(spec.world);
  run_ranks(spec.world, [&](int rank, CommunicatorPtr comm) {
    auto model = models[rank];
    auto strategy = cohort::make_strategy(cfg, model, comm);
    strategy->build_optimizer(cfg.optim);
    const int64_t per_rank = kGlobalBatch / spec.world, micro = per_rank / spec.accum;
    for (int s = 0; s < spec.steps; ++s) {
      const double lr = cfg.optim.lr * (1.0 - 0.5 * s / spec.steps);  // a schedule: the lr changes every step
      for (int m = 0; m < spec.accum; ++m) {
        auto sync = strategy->gradient_sync(m == spec.accum - 1);
        const int64_t at = rank * per_rank + m * micro;
        const auto& d = all_data()[s];
        auto loss =
            torch::nn::functional::cross_entropy(model->forward(d.x.narrow(0, at, micro)), d.y.narrow(0, at, micro));
        if (spec.announce && m == spec.accum - 1) strategy->prepare_step(lr, {});
        (loss / static_cast<double>(spec.accum)).backward();
      }
      const auto r = strategy->step(lr, {});
      EXPECT_FALSE(r.nonfinite);
    }
    for (const auto& p : model->parameters()) params[rank].push_back(p.detach().clone());
    for (const auto& [name, t] : strategy->save_state().optimizer) params[rank].push_back(t.detach().clone());
  });
  for (int r = 1; r < spec.world; ++r)
    for (size_t i = 0; i < params[0].size(); ++i) EXPECT_TRUE(torch::equal(params[0][i], params[r][i])) << "rank " << r;
  return params[0];
}

double max_abs_diff(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) d = std::max(d, (a[i] - b[i]).abs().max().item<double>());
  return d;
}

// Two ranks under optim.in_backward with equal models, after build_optimizer: body(model, strategy, loss),
// where loss() is the rank's loss on its half of step 0's batch.
using OneStep = std::function<void(cohort::models::Classifier&, cohort::Strategy&, const std::function<at::Tensor()>&)>;
void on_two_ranks(const OneStep& body) {
  const auto cfg = config_for({true});
  std::vector<std::shared_ptr<cohort::models::Classifier>> models;
  for (int r = 0; r < 2; ++r) {
    torch::manual_seed(17);
    models.push_back(cohort::models::build(cfg.model, 1, 8));
  }
  run_ranks(2, [&](int rank, CommunicatorPtr comm) {
    auto strategy = cohort::make_strategy(cfg, models[rank], comm);
    strategy->build_optimizer(cfg.optim);
    const auto& d = all_data()[0];
    body(*models[rank], *strategy, [&, rank] {
      return torch::nn::functional::cross_entropy(models[rank]->forward(d.x.narrow(0, rank * 6, 6)),
                                                  d.y.narrow(0, rank * 6, 6));
    });
  });
}

void expect_same_as_plain(Spec spec, const std::string& what) {
  spec.in_backward = false;
  const auto plain = train(spec);
  spec.in_backward = true;
  const auto inside = train(spec);
  const double diff = max_abs_diff(plain, inside);
  EXPECT_LE(diff, 1e-6) << what;
  // Each parameter gets the very update the plain step gives it: on CPU the numbers are equal.
  EXPECT_EQ(diff, 0.0) << what;
}

}  // namespace

TEST(InBackward, DdpEqualsThePlainStepAfter50StepsWithSgdAndAdamWOn2And3RanksWithTheSameBuckets) {
  SKIP_WITHOUT_GLOO();
  expect_same_as_plain({false, "sgd", "none", 2}, "sgd, 2 ranks");
  Spec default_plans{false, "sgd", "none", 2};
  default_plans.same_plan = false;
  expect_same_as_plain(default_plans, "sgd, 2 ranks, in_backward's own small last bucket");
  expect_same_as_plain({false, "sgd", "none", 3}, "sgd, 3 ranks");
  expect_same_as_plain({false, "adamw", "none", 2}, "adamw, 2 ranks");
}

TEST(InBackward, WithAccumulationItStepsOnTheLastMicroBatchOnly) {
  SKIP_WITHOUT_GLOO();
  expect_same_as_plain({false, "sgd", "none", 2, /*accum=*/2}, "sgd, 2 ranks, 2 micro-batches");
}

TEST(InBackward, PowerSgdBucketsAreSteppedAfterBackwardInTheSameOrderOnEveryRank) {
  SKIP_WITHOUT_GLOO();
  expect_same_as_plain({false, "sgd", "powersgd", 2, 1, /*steps=*/12}, "powersgd, 2 ranks");
}

TEST(InBackward, TheParametersMoveDuringBackwardAndStepOnlyClearsTheGradients) {
  SKIP_WITHOUT_GLOO();
  on_two_ranks([](cohort::models::Classifier& model, cohort::Strategy& strategy, const auto& loss) {
    // The first parameter's gradient comes last; while its hook sleeps, the earlier buckets' all-reduces
    // end, and the next gradient's hook finds them done.
    model.parameters().front().register_hook([](at::Tensor g) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      return g;
    });
    std::vector<at::Tensor> before;
    for (const auto& p : model.parameters()) before.push_back(p.detach().clone());
    strategy.prepare_step(0.05, {});
    loss().backward();
    std::vector<at::Tensor> after_backward;
    for (const auto& p : model.parameters()) after_backward.push_back(p.detach().clone());
    size_t moved = 0;
    for (size_t i = 0; i < before.size(); ++i) moved += torch::equal(before[i], after_backward[i]) ? 0 : 1;
    EXPECT_EQ(moved, before.size()) << "every parameter is stepped by the end of backward";
    double early = -1;
    for (const auto& [name, value] : strategy.figures())
      if (name == "in_backward_early_buckets") early = value;
    EXPECT_GE(early, 1) << "a bucket was stepped before backward ended";
    EXPECT_FALSE(strategy.step(0.05, {}).nonfinite);
    size_t i = 0;
    for (const auto& p : model.parameters()) {
      EXPECT_TRUE(torch::equal(p.detach(), after_backward[i++])) << "step() moved a parameter again";
      EXPECT_FALSE(p.grad().defined());
    }
  });
}

TEST(InBackward, ANonFiniteBucketStopsTheStepAndTheResultSaysTheEarlierBucketsMoved) {
  SKIP_WITHOUT_GLOO();
  on_two_ranks([](cohort::models::Classifier& model, cohort::Strategy& strategy, const auto& loss) {
    // The first parameter's gradient comes last in backward, so it is in the last bucket.
    auto first = model.parameters().front();
    first.register_hook([](at::Tensor g) { return g * std::numeric_limits<float>::quiet_NaN(); });
    const auto last_before = model.parameters().back().detach().clone();
    const auto first_before = first.detach().clone();
    strategy.prepare_step(0.05, {});
    loss().backward();
    const auto r = strategy.step(0.05, {});
    EXPECT_TRUE(r.nonfinite);
    EXPECT_TRUE(r.updated_in_backward);
    EXPECT_FALSE(torch::equal(model.parameters().back().detach(), last_before)) << "an early bucket moved";
    EXPECT_TRUE(torch::equal(first.detach(), first_before)) << "the non-finite bucket did not move";
  });
}

TEST(InBackward, WithoutPrepareStepOrAtWorldSizeOneItStepsAfterBackward) {
  SKIP_WITHOUT_GLOO();
  Spec spec{true};
  spec.announce = false;
  spec.steps = 5;
  const auto unannounced = train(spec);
  spec.in_backward = false;
  EXPECT_EQ(max_abs_diff(unannounced, train(spec)), 0.0);
  spec = Spec{true};
  spec.world = 1;
  spec.steps = 5;
  const auto alone = train(spec);
  spec.in_backward = false;
  EXPECT_EQ(max_abs_diff(alone, train(spec)), 0.0);
}

TEST(InBackward, WhatCannotCombineIsRefusedWithTheReasonAndTheAlternative) {
  auto refused = [](const std::vector<std::string>& overrides, const std::string& says) {
    TrainConfig cfg;
    cohort::config::apply_override(cfg, "optim.in_backward=true");
    for (const auto& o : overrides) cohort::config::apply_override(cfg, o);
    try {
      cohort::config::validate(cfg);
      ADD_FAILURE() << "accepted: " << overrides.front();
    } catch (const cohort::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
      EXPECT_NE(e.hint().find("optim.in_backward=false"), std::string::npos) << e.hint();
    }
  };
  refused({"optim.clip_grad_norm=1"}, "needs the norm of every gradient");
  refused({"amp.precision=fp16"}, "scales the loss");
  refused({"amp.precision=fp16-master"}, "scales the loss");
  refused({"dist.strategy=swarm", "swarm.insecure=true"}, "swarm's schedule");
  refused({"dist.strategy=zero2"}, "built for dist.strategy=ddp so far");
  TrainConfig ok;
  cohort::config::apply_override(ok, "optim.in_backward=true");
  cohort::config::apply_override(ok, "amp.precision=bf16");
  EXPECT_NO_THROW(cohort::config::validate(ok));
  // On a GPU without bf16, auto picks fp32 rather than fp16 with loss scaling.
  TrainConfig old_gpu;
  cohort::config::apply_override(old_gpu, "optim.in_backward=true");
  cohort::train::Hardware hw;
  hw.cuda = true;
  hw.cuda_major = 7;
  cohort::train::resolve_auto(old_gpu, hw);
  EXPECT_EQ(old_gpu.amp.precision, "fp32");
}

// optim.in_backward: under ddp each bucket stepped as its all-reduce ends (Note [The optimizer inside
// backward] in parallel/ddp/DdpStrategy.cpp), under zero1, zero2 and fsdp each unit's slice as its reduce-scatter
// ends (Note [Sharded steps inside backward]), against the plain step after backward on the same global
// batches, with ranks as threads over Gloo.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <thread>

#include <torch/torch.h>

#include "cohort/config/Config.h"
#include "cohort/models/Models.h"
#include "cohort/parallel/shard/ShardedStrategy.h"
#include "cohort/train/AutoSettings.h"
#include "cohort/train/StrategyFactory.h"
#include "cohort/util/Error.h"
#include "unit/ThreadRanks.h"

using cohort::TrainConfig;
using cohort::comm::CommunicatorPtr;
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
  std::string strategy = "ddp";
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
  cfg.dist.strategy = spec.strategy;
  return cfg;
}

// The full parameters (ddp's own, or gathered from the shards), then this rank's optimizer state as a
// checkpoint holds it (the sharded strategies': its slices, masters first).
std::vector<at::Tensor> parameters_then_state(cohort::parallel::Strategy& strategy, torch::nn::Module& model) {
  std::vector<at::Tensor> out;
  if (auto* sharded = dynamic_cast<cohort::parallel::shard::ShardedStrategy*>(&strategy))
    for (const auto& [name, t] : sharded->full_parameters()) out.push_back(t);
  else
    for (const auto& p : model.parameters()) out.push_back(p.detach().clone());
  auto state = strategy.save_state();
  for (const auto& [name, t] : state.optimizer) out.push_back(t.detach().clone());
  if (state.shards) {
    for (const auto& t : state.shards->params) out.push_back(t.clone());
    for (const auto& [kind, slices] : state.shards->state)
      for (const auto& t : slices) out.push_back(t.clone());
  }
  return out;
}

// Every rank's parameters_then_state after the run (the parameters are equal on every rank: checked).
std::vector<std::vector<at::Tensor>> train(const Spec& spec) {
  const auto cfg = config_for(spec);
  std::vector<std::shared_ptr<cohort::models::Classifier>> models;
  for (int r = 0; r < spec.world; ++r) {
    torch::manual_seed(r == 0 ? 17 : 500 + r);
    models.push_back(cohort::models::build(cfg.model, 1, 8));
  }
  std::vector<std::vector<at::Tensor>> params(spec.world);
  run_ranks(spec.world, [&](int rank, CommunicatorPtr comm) {
    auto model = models[rank];
    auto strategy = cohort::train::make_strategy(cfg, model, comm);
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
    if (spec.in_backward && spec.announce && spec.world > 1) {
      double stepped_seconds = 0;  // hidden and exposed: the steps taken inside backward
      for (const auto& [name, value] : strategy->figures())
        if (name.find("_seconds") != std::string::npos) stepped_seconds += value;
      EXPECT_GT(stepped_seconds, 0) << "nothing was stepped inside backward";
    }
    params[rank] = parameters_then_state(*strategy, *model);
  });
  const size_t n = models[0]->parameters().size();
  for (int r = 1; r < spec.world; ++r)
    for (size_t i = 0; i < n; ++i) EXPECT_TRUE(torch::equal(params[0][i], params[r][i])) << "rank " << r;
  return params;
}

double max_abs_diff(const std::vector<std::vector<at::Tensor>>& a, const std::vector<std::vector<at::Tensor>>& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0;
  for (size_t r = 0; r < a.size() && r < b.size(); ++r) {
    EXPECT_EQ(a[r].size(), b[r].size());
    for (size_t i = 0; i < a[r].size() && i < b[r].size(); ++i)
      if (a[r][i].numel() > 0) d = std::max(d, (a[r][i] - b[r][i]).abs().max().item<double>());
  }
  return d;
}

// Two ranks under optim.in_backward with equal models, after build_optimizer: body(model, strategy, loss),
// where loss() is the rank's loss on its half of step 0's batch.
using OneStep =
    std::function<void(cohort::models::Classifier&, cohort::parallel::Strategy&, const std::function<at::Tensor()>&)>;
void on_two_ranks(const OneStep& body, const std::string& strategy = "ddp") {
  Spec spec{true};
  spec.strategy = strategy;
  const auto cfg = config_for(spec);
  std::vector<std::shared_ptr<cohort::models::Classifier>> models;
  for (int r = 0; r < 2; ++r) {
    torch::manual_seed(17);
    models.push_back(cohort::models::build(cfg.model, 1, 8));
  }
  run_ranks(2, [&](int rank, CommunicatorPtr comm) {
    auto strategy = cohort::train::make_strategy(cfg, models[rank], comm);
    strategy->build_optimizer(cfg.optim);
    const auto& d = all_data()[0];
    body(*models[rank], *strategy, [&, rank] {
      return torch::nn::functional::cross_entropy(models[rank]->forward(d.x.narrow(0, rank * 6, 6)),
                                                  d.y.narrow(0, rank * 6, 6));
    });
  });
}

std::vector<at::Tensor> weights(torch::nn::Module& model) {
  std::vector<at::Tensor> out;
  for (const auto& p : model.parameters()) out.push_back(p.detach().clone());
  return out;
}

// The first parameter's gradient comes last in backward. While its hook sleeps, the reductions launched
// before it end, and the next gradient's hook finds them done.
void delay_last_gradient(torch::nn::Module& model) {
  model.parameters().front().register_hook([](at::Tensor g) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    return g;
  });
}

double figure(const cohort::parallel::Strategy& strategy, const std::string& name) {
  for (const auto& [n, value] : strategy.figures())
    if (n == name) return value;
  return -1;
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

Spec sharded(const std::string& strategy, const std::string& optimizer, int world, int accum = 1) {
  Spec spec{false, optimizer, "none", world, accum};
  spec.strategy = strategy;
  return spec;
}

// The slices get the very update the plain step gives them, from the same reduce-scatters: checked on
// the gathered parameters and on every rank's optimizer state.
TEST(InBackward, ShardedStrategiesEqualThePlainStepAfter50Steps) {
  SKIP_WITHOUT_GLOO();
  expect_same_as_plain(sharded("zero1", "sgd", 2), "zero1, sgd, 2 ranks");
  expect_same_as_plain(sharded("zero2", "adamw", 2), "zero2, adamw, 2 ranks");
  expect_same_as_plain(sharded("fsdp", "sgd", 3), "fsdp, sgd, 3 ranks");
  expect_same_as_plain(sharded("fsdp", "adamw", 2), "fsdp, adamw, 2 ranks");
}

TEST(InBackward, ShardedWithAccumulationItStepsOnTheLastMicroBatchOnly) {
  SKIP_WITHOUT_GLOO();
  expect_same_as_plain(sharded("zero1", "adamw", 2, /*accum=*/2), "zero1, 2 micro-batches");
  expect_same_as_plain(sharded("zero2", "sgd", 2, /*accum=*/2), "zero2, 2 micro-batches");
}

// The masters move during backward; the parameters the model reads are gathered at the step.
TEST(InBackward, ShardedSlicesAreSteppedDuringBackwardAndTheStepGathersThem) {
  SKIP_WITHOUT_GLOO();
  on_two_ranks(
      [](cohort::models::Classifier& model, cohort::parallel::Strategy& strategy, const auto& loss) {
        delay_last_gradient(model);
        const auto before = weights(model);
        strategy.prepare_step(0.05, {});
        loss().backward();
        EXPECT_GE(figure(strategy, "in_backward_early_units"), 1) << "a unit was stepped before backward ended";
        size_t i = 0;
        for (const auto& p : model.parameters())
          EXPECT_TRUE(torch::equal(p.detach(), before[i++])) << "a weight backward reads moved before the step";
        EXPECT_FALSE(strategy.step(0.05, {}).nonfinite);
        size_t moved = 0;
        i = 0;
        for (const auto& p : model.parameters()) moved += torch::equal(p.detach(), before[i++]) ? 0 : 1;
        EXPECT_EQ(moved, before.size()) << "the step gathers every updated parameter";
      },
      "zero2");
}

TEST(InBackward, AShardedNonFiniteSliceStopsTheStepOnEveryRank) {
  SKIP_WITHOUT_GLOO();
  for (const std::string strategy : {"zero1", "fsdp"})
    on_two_ranks(
        [&](cohort::models::Classifier& model, cohort::parallel::Strategy& s, const auto& loss) {
          // The first parameter's unit is reduced last, and only one rank's slice holds it.
          model.parameters().front().register_hook(
              [](at::Tensor g) { return g * std::numeric_limits<float>::quiet_NaN(); });
          s.prepare_step(0.05, {});
          loss().backward();
          const auto r = s.step(0.05, {});
          EXPECT_TRUE(r.nonfinite) << strategy;
          EXPECT_TRUE(r.updated_in_backward) << strategy;
        },
        strategy);
}

TEST(InBackward, TheParametersMoveDuringBackwardAndStepOnlyClearsTheGradients) {
  SKIP_WITHOUT_GLOO();
  on_two_ranks([](cohort::models::Classifier& model, cohort::parallel::Strategy& strategy, const auto& loss) {
    delay_last_gradient(model);
    const auto before = weights(model);
    strategy.prepare_step(0.05, {});
    loss().backward();
    const auto after_backward = weights(model);
    size_t moved = 0;
    for (size_t i = 0; i < before.size(); ++i) moved += torch::equal(before[i], after_backward[i]) ? 0 : 1;
    EXPECT_EQ(moved, before.size()) << "every parameter is stepped by the end of backward";
    EXPECT_GE(figure(strategy, "in_backward_early_buckets"), 1) << "a bucket was stepped before backward ended";
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
  on_two_ranks([](cohort::models::Classifier& model, cohort::parallel::Strategy& strategy, const auto& loss) {
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

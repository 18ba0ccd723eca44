#include <gtest/gtest.h>

#include <cmath>

#include <torch/torch.h>

#include "cohort/config/Config.h"
#include "cohort/optim/Schedule.h"
#include "cohort/optim/Sgd.h"
#include "cohort/util/Error.h"

TEST(Sgd, MatchesTorchOptimSgd) {
  for (bool nesterov : {false, true}) {
    torch::manual_seed(3);
    auto a = torch::randn({5, 4}, torch::requires_grad());
    auto b = a.detach().clone().requires_grad_(true);
    cohort::optim::Sgd ours({{{"w"}, {a}, 0.01}}, {0.9, nesterov});
    torch::optim::SGD theirs({b}, torch::optim::SGDOptions(0.1).momentum(0.9).nesterov(nesterov).weight_decay(0.01));
    for (int s = 0; s < 5; ++s) {
      auto g = torch::randn({5, 4});
      a.mutable_grad() = g.clone();
      b.mutable_grad() = g.clone();
      ours.step(0.1);
      theirs.step();
      EXPECT_TRUE(torch::allclose(a, b, 1e-6, 1e-7)) << "nesterov " << nesterov << " step " << s;
    }
  }
}

TEST(AdamW, MatchesTorchOptimAdamW) {
  torch::manual_seed(4);
  auto a = torch::randn({6, 3}, torch::requires_grad());
  auto b = a.detach().clone().requires_grad_(true);
  cohort::optim::AdamW ours({{{"w"}, {a}, 0.05}}, {0.9, 0.98, 1e-7});
  torch::optim::AdamW theirs({b}, torch::optim::AdamWOptions(3e-3).betas({0.9, 0.98}).eps(1e-7).weight_decay(0.05));
  for (int s = 0; s < 6; ++s) {
    auto g = torch::randn({6, 3});
    a.mutable_grad() = g.clone();
    b.mutable_grad() = g.clone();
    ours.step(3e-3);
    theirs.step();
    EXPECT_TRUE(torch::allclose(a, b, 1e-6, 1e-7)) << "step " << s;
  }
}

TEST(AdamW, StateRoundTripsWithItsStepCount) {
  auto w = torch::randn({4}, torch::requires_grad());
  auto v = w.detach().clone().requires_grad_(true);
  cohort::optim::AdamW opt({{{"w"}, {w}, 0.01}}, {});
  for (int s = 0; s < 3; ++s) {
    w.mutable_grad() = torch::full({4}, 0.5 + s);
    opt.step(0.01);
  }
  const auto state = opt.state_dict();
  ASSERT_EQ(state.size(), 3u);  // exp_avg.w, exp_avg_sq.w, step
  cohort::optim::AdamW other({{{"w"}, {v}, 0.01}}, {});
  v.detach().copy_(w.detach());
  other.load_state_dict(state);
  EXPECT_EQ(other.steps(), 3);
  w.mutable_grad() = torch::ones({4});
  v.mutable_grad() = torch::ones({4});
  opt.step(0.01);
  other.step(0.01);
  EXPECT_TRUE(torch::equal(w, v));
  EXPECT_THROW(other.load_state_dict({{"exp_avg.nope", torch::zeros({4})}}), cohort::CheckpointError);
}

TEST(Sgd, GroupLrScaleMatchesATorchParamGroupWithThatLr) {
  torch::manual_seed(6);
  auto a = torch::randn({4}, torch::requires_grad());
  auto b = a.detach().clone().requires_grad_(true);
  cohort::optim::ParamGroup g{{"norm.bias"}, {a}, 0.01 / 64};
  g.lr_scale = 64;
  cohort::optim::Sgd ours({g}, {0.85, true});
  torch::optim::SGD theirs({b},
                           torch::optim::SGDOptions(0.05 * 64).momentum(0.85).nesterov(true).weight_decay(0.01 / 64));
  for (int s = 0; s < 4; ++s) {
    auto grad = torch::randn({4});
    a.mutable_grad() = grad.clone();
    b.mutable_grad() = grad.clone();
    ours.step(0.05);
    theirs.step();
    EXPECT_TRUE(torch::allclose(a, b, 1e-6, 1e-7)) << "step " << s;
  }
}

TEST(Sgd, NormGroupGetsScaledLrAndTheSameDecayPerStep) {
  torch::OrderedDict<std::string, at::Tensor> named;
  named.insert("layers.0.conv1.weight", torch::zeros({2, 2, 3, 3}, torch::requires_grad()));
  named.insert("layers.0.norm1.bias", torch::zeros({2}, torch::requires_grad()));
  named.insert("head.weight", torch::zeros({10, 2}, torch::requires_grad()));
  const auto groups = cohort::optim::split_groups(named, {0.002, /*decay_all=*/true, /*norm_lr_scale=*/64});
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].names, (std::vector<std::string>{"layers.0.conv1.weight", "head.weight"}));
  EXPECT_EQ(groups[1].names, std::vector<std::string>{"layers.0.norm1.bias"});
  EXPECT_DOUBLE_EQ(groups[1].lr_scale, 64);
  EXPECT_DOUBLE_EQ(groups[1].lr_scale * groups[1].weight_decay, groups[0].lr_scale * groups[0].weight_decay);
  // Without the scale, "norm" names are ordinary no-decay parameters.
  const auto plain = cohort::optim::split_groups(named, {0.002, false, 1.0});
  ASSERT_EQ(plain.size(), 2u);
  EXPECT_EQ(plain[1].names, std::vector<std::string>{"layers.0.norm1.bias"});
  EXPECT_DOUBLE_EQ(plain[1].weight_decay, 0.0);
}

TEST(Sgd, AFrozenParameterNeitherMovesNorAdvancesItsMomentum) {
  auto w = torch::ones({3}, torch::requires_grad());
  auto b = torch::ones({3}, torch::requires_grad());
  cohort::optim::Sgd opt({{{"w", "whiten.bias"}, {w, b}, 0.1}}, {0.9, true});
  w.mutable_grad() = torch::ones({3});
  b.mutable_grad() = torch::ones({3});
  opt.step(0.1);
  const auto momentum_before = opt.state_dict()[1].second.clone();
  opt.freeze("whiten.bias");
  const auto b_before = b.detach().clone(), w_before = w.detach().clone();
  opt.step(0.1);
  EXPECT_TRUE(torch::equal(b, b_before));
  EXPECT_TRUE(torch::equal(opt.state_dict()[1].second, momentum_before));
  EXPECT_FALSE(torch::equal(w, w_before));
}

TEST(Sgd, NoDecayOnNormAndBias) {
  auto lin = torch::nn::Linear(3, 2);
  auto bn = torch::nn::BatchNorm1d(2);
  torch::OrderedDict<std::string, at::Tensor> named;
  named.insert("fc.weight", lin->weight);
  named.insert("fc.bias", lin->bias);
  named.insert("bn.weight", bn->weight);
  const auto groups = cohort::optim::split_decay(named, 5e-4, false);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].names, std::vector<std::string>{"fc.weight"});
  EXPECT_DOUBLE_EQ(groups[0].weight_decay, 5e-4);
  EXPECT_EQ(groups[1].names, (std::vector<std::string>{"fc.bias", "bn.weight"}));
  EXPECT_DOUBLE_EQ(groups[1].weight_decay, 0.0);
}

TEST(Sgd, StateRoundTrips) {
  auto w = torch::randn({3}, torch::requires_grad());
  cohort::optim::Sgd opt({{{"w"}, {w}, 0}}, {0.9, false});
  w.mutable_grad() = torch::ones({3});
  opt.step(0.1);
  const auto state = opt.state_dict();
  ASSERT_EQ(state.size(), 1u);
  EXPECT_EQ(state[0].first, "momentum_buffer.w");
  cohort::optim::Sgd other({{{"w"}, {w}, 0}}, {0.9, false});
  other.load_state_dict(state);
  EXPECT_TRUE(torch::equal(other.state_dict()[0].second, state[0].second));
}

TEST(Schedule, OneCycleFollowsPyTorch) {
  cohort::SchedConfig c;  // onecycle, div 25, final_div 1e4
  c.pct_start = 0.25;
  cohort::optim::Schedule s(c, 1.0, 100, 10);
  EXPECT_NEAR(s.lr(0), 1.0 / 25, 1e-12);
  // Peak at step pct*total - 1 = 24.
  EXPECT_NEAR(s.lr(24), 1.0, 1e-12);
  EXPECT_NEAR(s.lr(99), 1.0 / 25 / 1e4, 1e-12);
  // Half-way up the cosine: mean of initial and peak.
  EXPECT_NEAR(s.lr(12), (1.0 / 25 + 1.0) / 2, 1e-12);
  for (int i = 25; i < 100; ++i) EXPECT_LE(s.lr(i), s.lr(i - 1));
}

// OneCycleLR(cycle_momentum=True): momentum falls from max to base while the lr rises, then comes back.
// tests/reference/optim.py checks the whole run against torch's, SGD and AdamW.
TEST(Schedule, OneCycleCyclesTheMomentumAsPyTorchDoes) {
  cohort::SchedConfig c;    // onecycle
  c.cycle_momentum = true;  // momentum 0.95 -> 0.85 -> 0.95
  c.pct_start = 0.25;
  cohort::optim::Schedule s(c, 1.0, 100, 10);
  EXPECT_NEAR(s.momentum(0), 0.95, 1e-12);
  EXPECT_NEAR(s.momentum(12), 0.90, 1e-12);  // half-way down while the lr is half-way up
  EXPECT_NEAR(s.momentum(24), 0.85, 1e-12);  // the peak lr
  EXPECT_NEAR(s.momentum(99), 0.95, 1e-12);
  for (int i = 25; i < 100; ++i) EXPECT_GE(s.momentum(i), s.momentum(i - 1));
  c.cycle_momentum = false;
  EXPECT_EQ(cohort::optim::Schedule(c, 1.0, 100, 10).momentum(24), -1) << "the optimizer keeps its own";
  c.cycle_momentum = true;
  c.name = "cosine";
  EXPECT_EQ(cohort::optim::Schedule(c, 1.0, 100, 10).momentum(24), -1) << "only onecycle cycles it";
  cohort::TrainConfig cfg;
  cfg.sched.cycle_momentum = true;
  cfg.sched.base_momentum = 0.97;
  EXPECT_THROW(cohort::config::validate(cfg), cohort::ConfigError) << "base above max";
}

TEST(Schedule, WarmupCosineStepConstant) {
  cohort::SchedConfig c;
  c.warmup_epochs = 1;
  c.warmup_start_factor = 0.1;
  c.name = "cosine";
  cohort::optim::Schedule cos(c, 2.0, 100, 10);
  EXPECT_NEAR(cos.lr(0), 0.2, 1e-12);
  EXPECT_NEAR(cos.lr(5), 0.2 + 1.8 * 0.5, 1e-12);
  EXPECT_NEAR(cos.lr(10), 2.0, 1e-12);
  EXPECT_NEAR(cos.lr(55), 1.0, 1e-12);  // half-way through the cosine part
  c.name = "step";
  c.step_epochs = 3;
  c.gamma = 0.5;
  cohort::optim::Schedule step(c, 2.0, 100, 10);
  EXPECT_NEAR(step.lr(29), 2.0, 1e-12);
  EXPECT_NEAR(step.lr(30), 1.0, 1e-12);
  EXPECT_NEAR(step.lr(60), 0.5, 1e-12);
  c.name = "constant";
  cohort::optim::Schedule constant(c, 2.0, 100, 10);
  EXPECT_NEAR(constant.lr(3), 0.2 + 1.8 * 0.3, 1e-12);
  EXPECT_NEAR(constant.lr(99), 2.0, 1e-12);
}

// Multi-tensor (optim.foreach) updates against the per-parameter loop: Note [One call per operation per
// group] in optim/Sgd.cpp. Each test runs in well under a second.
#include <gtest/gtest.h>

#include <functional>

#include <torch/torch.h>

#include "cohort/config/Config.h"
#include "cohort/optim/Sgd.h"
#include "cohort/util/Error.h"
#include "cohort/util/TorchCompat.h"

namespace {

using cohort::optim::ParamGroup;

// Two groups of parameters of several shapes (one a scalar), on `device`.
std::vector<ParamGroup> make_groups(const c10::Device& device, double decay) {
  torch::manual_seed(11);
  auto opts = torch::TensorOptions().device(device).requires_grad(true);
  ParamGroup a{{"conv.weight", "fc.weight", "fc.bias"},
               {torch::randn({8, 3, 3, 3}, opts), torch::randn({10, 40}, opts), torch::randn({10}, opts)},
               decay};
  ParamGroup b{{"norm.weight", "norm.bias", "scale"},
               {torch::randn({16}, opts), torch::randn({16}, opts), torch::randn({}, opts)},
               0};
  b.lr_scale = 4;
  return {a, b};
}

std::vector<ParamGroup> copy_of(const std::vector<ParamGroup>& groups) {
  auto out = groups;
  for (auto& g : out)
    for (auto& p : g.params) p = p.detach().clone().requires_grad_(true);
  return out;
}

// Steps `loop` and `multi` alike for `steps` steps with the same random gradients. Parameter 2 of group 0
// has no gradient on odd steps, and "norm.bias" is frozen after step 2, so both skip alike.
void step_both(cohort::optim::Optimizer& loop, cohort::optim::Optimizer& multi, int steps, double lr) {
  for (int s = 0; s < steps; ++s) {
    if (s == 2) {
      loop.freeze("norm.bias");
      multi.freeze("norm.bias");
    }
    for (size_t gi = 0; gi < loop.groups().size(); ++gi)
      for (size_t i = 0; i < loop.groups()[gi].params.size(); ++i) {
        auto a = loop.groups()[gi].params[i], b = multi.groups()[gi].params[i];
        if (gi == 0 && i == 2 && s % 2 == 1) {
          a.mutable_grad().reset();
          b.mutable_grad().reset();
          continue;
        }
        auto g = torch::randn_like(a);
        a.mutable_grad() = g.clone();
        b.mutable_grad() = g.clone();
      }
    loop.step(lr);
    multi.step(lr);
  }
}

// Parameters and state of the two, equal or within `tol` (0: bitwise).
void expect_same(const cohort::optim::Optimizer& loop, const cohort::optim::Optimizer& multi, double tol,
                 const std::string& what) {
  for (size_t gi = 0; gi < loop.groups().size(); ++gi)
    for (size_t i = 0; i < loop.groups()[gi].params.size(); ++i) {
      const auto a = loop.groups()[gi].params[i].detach().cpu(), b = multi.groups()[gi].params[i].detach().cpu();
      if (tol == 0)
        EXPECT_TRUE(torch::equal(a, b)) << what << ": " << loop.groups()[gi].names[i];
      else
        EXPECT_TRUE(torch::allclose(a, b, tol, tol)) << what << ": " << loop.groups()[gi].names[i];
    }
  const auto sa = loop.state_dict(), sb = multi.state_dict();
  ASSERT_EQ(sa.size(), sb.size()) << what;
  for (size_t k = 0; k < sa.size(); ++k) {
    EXPECT_EQ(sa[k].first, sb[k].first) << what;
    const auto a = sa[k].second.cpu(), b = sb[k].second.cpu();
    if (tol == 0)
      EXPECT_TRUE(torch::equal(a, b)) << what << ": " << sa[k].first;
    else
      EXPECT_TRUE(torch::allclose(a, b, tol, tol)) << what << ": " << sa[k].first;
  }
}

void sgd_cases(const c10::Device& device, double tol) {
  for (double momentum : {0.0, 0.9})
    for (bool nesterov : {false, true})
      for (double decay : {0.0, 5e-4}) {
        if (momentum == 0 && nesterov) continue;
        const auto groups = make_groups(device, decay);
        cohort::optim::Sgd loop(copy_of(groups), {momentum, nesterov, false});
        cohort::optim::Sgd multi(copy_of(groups), {momentum, nesterov, true});
        step_both(loop, multi, 6, 0.1);
        expect_same(loop, multi, tol,
                    "momentum " + std::to_string(momentum) + " nesterov " + std::to_string(nesterov) + " decay " +
                        std::to_string(decay));
      }
}

void adamw_cases(const c10::Device& device, double tol) {
  for (double decay : {0.0, 0.05}) {
    const auto groups = make_groups(device, decay);
    cohort::optim::AdamW loop(copy_of(groups), {0.9, 0.98, 1e-7, false});
    cohort::optim::AdamW multi(copy_of(groups), {0.9, 0.98, 1e-7, true});
    step_both(loop, multi, 6, 3e-3);
    expect_same(loop, multi, tol, "adamw decay " + std::to_string(decay));
  }
}

}  // namespace

TEST(ForeachSgd, EqualsTheLoopBitwiseOnCpu) { sgd_cases(c10::Device("cpu"), 0); }

TEST(ForeachAdamW, EqualsTheLoopOnCpu) {
  // LibTorch 1.13 has no _foreach_lerp_, so the first moment is rounded once more there: 1e-7.
  adamw_cases(c10::Device("cpu"), cohort::util::compat::kTorchMajor >= 2 ? 0 : 1e-7);
}

TEST(ForeachSgd, EqualsTheLoopWithin1e7OnCuda) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  sgd_cases(c10::Device("cuda:0"), 1e-7);
}

TEST(ForeachAdamW, EqualsTheLoopWithin1e7OnCuda) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  adamw_cases(c10::Device("cuda:0"), 1e-7);
}

TEST(ForeachSetting, AutoIsOnForCudaParametersAndAnExplicitValueWins) {
  auto cpu = make_groups(c10::Device("cpu"), 0);
  EXPECT_FALSE(cohort::optim::use_foreach("auto", cpu));
  EXPECT_TRUE(cohort::optim::use_foreach("true", cpu));
  EXPECT_FALSE(cohort::optim::use_foreach("false", cpu));
  EXPECT_FALSE(cohort::optim::use_foreach("auto", {}));
  cohort::TrainConfig cfg;
  EXPECT_EQ(cfg.optim.foreach, "auto");
  cohort::config::apply_override(cfg, "optim.foreach=ON");
  EXPECT_EQ(cfg.optim.foreach, "true");
  EXPECT_THROW(cohort::config::apply_override(cfg, "optim.foreach=sometimes"), cohort::ConfigError);
}

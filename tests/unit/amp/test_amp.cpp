// Mixed precision on CPU: the loss scaler's rule, unscaling, every rank skipping an overflowed step
// together (ddp and zero2, ranks as threads over real Gloo), bf16 autocast against fp32, fp32 master
// weights under fp16 storage, and the scaler state in checkpoints. See Note [The mixed-precision dtype
// contract] in amp/MixedPrecision.h.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include <torch/torch.h>

#include "cohort/amp/GradScaler.h"
#include "cohort/amp/MasterWeights.h"
#include "cohort/amp/MixedPrecision.h"
#include "cohort/checkpoint/Checkpoint.h"
#include "cohort/models/Models.h"
#include "cohort/parallel/ddp/CommHook.h"
#include "cohort/train/StrategyFactory.h"
#include "cohort/util/Error.h"
#include "unit/ThreadRanks.h"

using namespace cohort;
using cohort::testing::random_batches;
using cohort::testing::run_ranks;
using cohort::train::make_comm_hook;
using cohort::train::make_strategy;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

amp::GradScaler scaler(int64_t growth_interval = 2000) {
  AmpConfig cfg;
  cfg.growth_interval = growth_interval;
  return amp::GradScaler(cfg, /*enabled=*/true);
}

}  // namespace

TEST(GradScaler, StartsAtInitScaleBacksOffOnOverflowAndGrowsAfterTheInterval) {
  auto s = scaler(/*growth_interval=*/3);
  EXPECT_EQ(s.scale(), 65536.0);
  EXPECT_DOUBLE_EQ(s.scale(at::ones({1})).item<double>(), 65536.0);
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 32768.0);
  EXPECT_EQ(s.state().skipped_steps, 1);
  EXPECT_FALSE(s.update(false));
  EXPECT_FALSE(s.update(false));
  EXPECT_TRUE(s.update(false));  // the third clean step in a row
  EXPECT_EQ(s.scale(), 65536.0);
  EXPECT_EQ(s.state().growth_tracker, 0);
  // An overflow resets the count of clean steps.
  s.update(false), s.update(false), s.update(true), s.update(false), s.update(false);
  EXPECT_EQ(s.scale(), 32768.0);
  EXPECT_EQ(s.state().growth_tracker, 2);
  EXPECT_EQ(s.state().skipped_steps, 2);
}

TEST(GradScaler, DisabledScalerLeavesTheLossAlone) {
  amp::GradScaler s(AmpConfig{}, /*enabled=*/false);
  EXPECT_EQ(s.scale(), 1.0);
  auto loss = at::full({1}, 3.0);
  EXPECT_TRUE(s.scale(loss).equal(loss));
  EXPECT_FALSE(s.update(true));
  EXPECT_EQ(s.state().skipped_steps, 0);
}

TEST(GradScaler, NeverGrowsPastFloatRangeAndRefusesABadSavedState) {
  auto s = scaler(1);
  s.load_state({std::ldexp(1.0, 127), 0, 0});
  s.update(false);  // 2^128 does not fit a float32
  EXPECT_EQ(s.scale(), std::ldexp(1.0, 127));
  EXPECT_THROW(s.load_state({-1.0, 0, 0}), CheckpointError);
  EXPECT_THROW(s.load_state({kInf, 0, 0}), CheckpointError);
}

TEST(GradScaler, UnscaleDividesAndFindsInfAndNan) {
  auto a = at::full({4}, 8.0), b = at::full({2, 2}, -4.0);
  EXPECT_FALSE(amp::unscale_and_check({a, b, at::Tensor()}, 0.25));
  EXPECT_TRUE(a.equal(at::full({4}, 2.0)));
  EXPECT_TRUE(b.equal(at::full({2, 2}, -1.0)));
  auto h = at::full({3}, 1.0, at::kHalf);
  h[1] = kInf;
  EXPECT_TRUE(amp::unscale_and_check({a, h}, 1.0));
  b[0][1] = std::nan("");
  EXPECT_TRUE(amp::unscale_and_check({b}, 1.0));
}

// Every rank trains under loss scaling; rank 1 gets an inf at step 2 and rank 2 a NaN at step 4, after
// backward (so after the all-reduce: only that rank sees it). Every rank must skip exactly those steps,
// back off twice, and end with finite parameters identical across ranks.
TEST(GradScaler, EveryRankSkipsTheStepOneRankOverflowedWithDdpAndZero2) {
  SKIP_WITHOUT_GLOO();
  constexpr int kWorld = 3, kSteps = 6;
  const auto data = random_batches(kSteps, 12, 900);
  for (const std::string strategy_name : {"ddp", "zero2"}) {
    SCOPED_TRACE(strategy_name);
    TrainConfig cfg;
    cfg.model.name = "resnet8";
    cfg.model.width = 4;
    cfg.dist.strategy = strategy_name;
    cfg.optim.lr = 0.05;
    std::vector<std::shared_ptr<models::Classifier>> replicas;
    for (int r = 0; r < kWorld; ++r) replicas.push_back(models::build(cfg.model, 1, 8));
    std::vector<std::vector<bool>> skipped(kWorld);
    std::vector<std::vector<double>> scales(kWorld);
    run_ranks(kWorld, [&](int rank, comm::CommunicatorPtr comm) {
      auto model = replicas[rank];
      auto strategy = make_strategy(cfg, model, comm);
      strategy->build_optimizer(cfg.optim);
      auto s = scaler();
      for (int step = 1; step <= kSteps; ++step) {
        const auto& b = data[step - 1];
        const double bad = rank == 1 && step == 2 ? kInf : rank == 2 && step == 4 ? std::nan("") : 0.0;
        auto first = model->parameters()[0];
        // zero2 reduce-scatters during backward and keeps no full gradient, so the bad value goes in
        // before the reduction; it lands in rank 0's slice alone, and ranks 1 and 2 learn of it only
        // from the flag. ddp's gradients are whole after backward: rank 1 or 2 alone is poisoned then.
        const bool before_reduction = strategy_name != "ddp" && bad != 0.0;
        int hook = -1;
        if (before_reduction)
          hook = static_cast<int>(first.register_hook([bad](at::Tensor g) {
            g = g.clone();
            g.view(-1)[0].fill_(bad);
            return g;
          }));
        auto loss = torch::nn::functional::cross_entropy(model->forward(b.x.narrow(0, rank * 4, 4)),
                                                         b.y.narrow(0, rank * 4, 4));
        s.scale(loss).backward();
        if (hook >= 0) first.remove_hook(hook);
        if (!before_reduction && bad != 0.0) first.grad().view(-1)[0].fill_(bad);
        std::vector<at::Tensor> before;
        for (const auto& p : model->parameters()) before.push_back(p.detach().clone());
        const auto r = strategy->step(cfg.optim.lr, {0.0, /*skip_nonfinite=*/true, s.scale()});
        skipped[rank].push_back(r.skipped);
        s.update(r.nonfinite);
        scales[rank].push_back(s.scale());
        size_t i = 0;
        bool unchanged = true;
        for (const auto& p : model->parameters()) unchanged = unchanged && p.detach().equal(before[i++]);
        EXPECT_EQ(unchanged, r.skipped) << "rank " << rank << " step " << step;
      }
      for (const auto& p : model->parameters()) {
        EXPECT_TRUE(p.isfinite().all().item<bool>());
        auto all = at::zeros({kWorld, p.numel()});
        comm->all_gather(all, p.detach().reshape(-1).contiguous(), "check")->wait();
        for (int r = 1; r < kWorld; ++r) EXPECT_TRUE(all[0].equal(all[r])) << "rank " << r << " differs";
      }
    });
    const std::vector<bool> expected_skips{false, true, false, true, false, false};
    const std::vector<double> expected_scales{65536, 32768, 32768, 16384, 16384, 16384};
    for (int r = 0; r < kWorld; ++r) {
      EXPECT_EQ(skipped[r], expected_skips) << "rank " << r;
      EXPECT_EQ(scales[r], expected_scales) << "rank " << r;
    }
  }
}

// bf16 autocast runs conv and linear in bf16 on CPU (the logits come out bf16) and follows the fp32
// training closely: 5 SGD steps on the same batches, losses within 3% relative (bf16 keeps 8 bits of
// mantissa, about 0.4% per rounding; a few layers compound it).
TEST(Autocast, Bf16TrainingFollowsFp32WithinTolerance) {
  const auto data = random_batches(5, 16, 77);
  auto run = [&](const std::string& precision) {
    TrainConfig cfg;
    cfg.model.name = "resnet8";
    cfg.model.width = 8;
    cfg.amp.precision = precision;
    torch::manual_seed(5);
    auto model = models::build(cfg.model, 1, 8);
    amp::MixedPrecision mp(cfg.amp, c10::Device(c10::kCPU), /*lead=*/false);
    torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    std::vector<double> losses;
    for (const auto& b : data) {
      at::Tensor out;
      {
        auto guard = mp.autocast();
        out = model->forward(mp.input(b.x));
      }
      EXPECT_EQ(out.scalar_type(), precision == "bf16" ? at::kBFloat16 : at::kFloat);
      auto loss = torch::nn::functional::cross_entropy(mp.logits(out), b.y);
      opt.zero_grad();
      mp.scale(loss).backward();
      opt.step();
      losses.push_back(loss.item<double>());
    }
    // Outside the guard autocast is off again.
    EXPECT_EQ(model->forward(data[0].x).scalar_type(), at::kFloat);
    return losses;
  };
  const auto fp32 = run("fp32"), bf16 = run("bf16");
  for (size_t i = 0; i < fp32.size(); ++i) EXPECT_NEAR(bf16[i], fp32[i], 0.03 * fp32[i]) << "step " << i;
}

TEST(MixedPrecision, Fp16MasterNeedsCudaAndFp16OnCpuComputesInFp32) {
  AmpConfig cfg;
  cfg.precision = "fp16-master";
  EXPECT_THROW(amp::MixedPrecision(cfg, c10::Device(c10::kCPU), false), ConfigError);
  cfg.precision = "fp16";
  amp::MixedPrecision mp(cfg, c10::Device(c10::kCPU), false);
  EXPECT_TRUE(mp.scaling());
  EXPECT_EQ(mp.compute_dtype(), "float32");
  EXPECT_EQ(mp.loss_scale(), 65536.0);
  cfg.precision = "bf16";
  EXPECT_FALSE(amp::MixedPrecision(cfg, c10::Device(c10::kCPU), false).scaling());
}

TEST(MasterWeights, BatchNormStaysFp32AndEverythingElseBecomesFp16) {
  TrainConfig cfg;
  cfg.model.name = "resnet8";
  cfg.model.width = 4;
  auto model = models::build(cfg.model, 1, 8);
  amp::keep_batchnorm_fp32_else_half(*model);
  int bn = 0, half = 0;
  for (const auto& m : model->named_modules()) {
    const bool is_bn = dynamic_cast<torch::nn::BatchNorm2dImpl*>(m.value().get()) != nullptr;
    for (const auto& p : m.value()->named_parameters(/*recurse=*/false)) {
      EXPECT_EQ(p.value().scalar_type(), is_bn ? at::kFloat : at::kHalf) << m.key() << "." << p.key();
      (is_bn ? bn : half)++;
    }
    for (const auto& b : m.value()->named_buffers(/*recurse=*/false)) {
      if (b.value().is_floating_point()) {
        EXPECT_EQ(b.value().scalar_type(), is_bn ? at::kFloat : at::kHalf) << m.key() << "." << b.key();
      }
    }
  }
  EXPECT_GT(bn, 0);
  EXPECT_GT(half, 0);
}

// Apex O2's point: an update of 1e-4 per step is below fp16's spacing at 1.0 (2^-10), so fp16 weights
// updated in place never move, while the fp32 master accumulates it and the fp16 weight follows once
// the sum crosses a spacing. Run through the ddp strategy (two ranks), with fp16 parameters and fp16
// gradients from a real backward.
TEST(MasterWeights, DdpUpdatesFp32MastersThatSmallStepsAccumulateIn) {
  SKIP_WITHOUT_GLOO();
  run_ranks(2, [&](int rank, comm::CommunicatorPtr comm) {
    auto net = std::make_shared<torch::nn::Module>();
    auto w = net->register_parameter("w", at::ones({4}, at::kHalf));
    TrainConfig cfg;
    cfg.optim.momentum = 0;
    cfg.optim.nesterov = false;
    cfg.optim.weight_decay = 0;
    auto strategy = make_strategy(cfg, net, comm);
    strategy->build_optimizer(cfg.optim);
    auto state = strategy->save_state().optimizer;  // SGD without momentum holds no state: masters only
    ASSERT_EQ(state.size(), 1u);
    EXPECT_EQ(state[0].first, "master.w");
    EXPECT_EQ(state[0].second.scalar_type(), at::kFloat);
    const double lr = 1e-4, scale = 1024;
    for (int step = 0; step < 12; ++step) {
      auto loss = (w * at::ones({4}, at::kHalf)).sum();  // d loss / d w = 1 on every rank
      (loss * scale).backward();
      EXPECT_EQ(w.grad().scalar_type(), at::kHalf);
      const auto r = strategy->step(lr, {0.0, true, scale});
      EXPECT_FALSE(r.skipped);
    }
    const auto master = strategy->save_state().optimizer[0].second;
    EXPECT_NEAR(master[0].item<double>(), 1.0 - 12 * lr, 1e-6);
    EXPECT_TRUE(w.detach().equal(master.to(at::kHalf)));  // the weights are the rounded masters
    EXPECT_LT(w[0].item<double>(), 1.0);                  // 12e-4 crossed a spacing: the fp16 weight moved
    // Masters travel in the checkpoint and come back exactly.
    strategy->load_state({{"master.w", at::full({4}, 0.5)}}, {});
    EXPECT_EQ(strategy->save_state().optimizer[0].second[0].item<double>(), 0.5);
  });
}

TEST(CheckpointScaler, TheScaleSurvivesSaveAndLoadAndOldFilesHaveNone) {
  const auto dir = std::filesystem::temp_directory_path() / ("cohort-amp-ck-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  auto net = std::make_shared<torch::nn::Linear>(2, 2);
  checkpoint::TrainState st;
  st.step = 7;
  st.config_json = "{}";
  checkpoint::save(dir, "plain", **net, {}, st);
  EXPECT_EQ(checkpoint::load(dir, "plain").state.loss_scale, 0.0);
  st.loss_scale = 2048, st.loss_scale_growth_tracker = 17, st.skipped_steps = 5;
  checkpoint::save(dir, "scaled", **net, {}, st);
  const auto back = checkpoint::load(dir, "scaled").state;
  EXPECT_EQ(back.loss_scale, 2048);
  EXPECT_EQ(back.loss_scale_growth_tracker, 17);
  EXPECT_EQ(back.skipped_steps, 5);
  checkpoint::TrainState bad;
  EXPECT_THROW(checkpoint::parse_scaler_json("{\"scale\": -3, \"growth_tracker\": 0, \"skipped_steps\": 0}", bad, "x"),
               CheckpointError);
  EXPECT_THROW(checkpoint::parse_scaler_json("not json", bad, "x"), CheckpointError);
  std::filesystem::remove_all(dir);
}

TEST(GradDtype, CompressPicksTheLowPrecisionHook) {
  TrainConfig cfg;
  cfg.dist.compress = "bf16";
  EXPECT_EQ(make_comm_hook(cfg)->name(), "bf16");
  cfg.dist.compress = "fp16";
  EXPECT_EQ(make_comm_hook(cfg)->name(), "fp16");
}

TEST(GradDtype, TheRemovedKeySaysWhatToWriteInstead) {
  try {
    config::load(std::nullopt, {"dist.grad_dtype=bf16"});
    FAIL() << "dist.grad_dtype was accepted";
  } catch (const ConfigError& e) {
    const std::string what = e.describe();
    EXPECT_NE(what.find("'dist.grad_dtype' was removed"), std::string::npos) << what;
    EXPECT_NE(what.find("dist.compress=bf16"), std::string::npos) << what;
  }
}

TEST(AmpConfig, GrowthMustGrowAndBackoffMustShrink) {
  EXPECT_NO_THROW(
      config::load(std::nullopt, {"amp.precision=fp16", "amp.growth_factor=1.5", "amp.backoff_factor=0.25"}));
  for (const std::string bad :
       {"amp.growth_factor=1", "amp.growth_factor=0.5", "amp.backoff_factor=0", "amp.backoff_factor=1"}) {
    try {
      config::load(std::nullopt, {bad});
      ADD_FAILURE() << bad << " was accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(bad.substr(0, bad.find('='))), std::string::npos) << e.what();
    }
  }
}

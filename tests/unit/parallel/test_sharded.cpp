// ZeRO-1, ZeRO-2 and FSDP against DDP (and a single process) on the same global batches, with ranks as
// threads over Gloo; sharded checkpoints saved at one world size and loaded at others. The planner's own
// tests are in test_shard_plan.cpp.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <limits>
#include <map>
#include <set>

#include <torch/torch.h>

#include "cohort/checkpoint/Names.h"
#include "cohort/checkpoint/ShardedCheckpoint.h"
#include "cohort/models/Models.h"
#include "cohort/optim/Sgd.h"
#include "cohort/parallel/BucketPlan.h"
#include "cohort/parallel/shard/ShardPlan.h"
#include "cohort/parallel/shard/ShardedStrategy.h"
#include "cohort/train/StrategyFactory.h"
#include "cohort/util/Error.h"
#include "unit/ThreadRanks.h"
#include "unit/parallel/SaveShards.h"

namespace fs = std::filesystem;
using cohort::TrainConfig;
using cohort::comm::CommunicatorPtr;
using cohort::parallel::shard::ParamSpec;
using cohort::parallel::shard::ShardPlan;
using cohort::testing::run_ranks;

namespace {

// ---------------------------------------------------------------------------------------------------
// Training parity

constexpr int64_t kGlobalBatch = 24;  // divides by 2, 3 and 4
constexpr int kSteps = 20;

using Data = cohort::testing::Batch;
// The global generator is shared by the rank threads, so all random data is drawn up front, serially.
const std::vector<Data>& all_data() {
  static const std::vector<Data> data = cohort::testing::random_batches(kSteps, kGlobalBatch, 2000);
  return data;
}

struct RunSpec {
  std::string strategy = "ddp";
  std::string model = "resnet8";
  std::string optimizer = "sgd";
  int world = 2;
  int first_step = 0;
  int steps = kSteps;
  double clip = 0;
  int accum = 1;
  std::string fsdp_unit = "block";
  // Checkpoint hooks: load before wrapping (weights) and after build_optimizer (state); save at the end.
  const cohort::checkpoint::Checkpoint* resume = nullptr;
  fs::path save_dir;
};

struct RunResult {
  std::vector<std::vector<double>> losses;                              // [rank][step]
  std::vector<std::vector<double>> norms;                               // [rank][step]
  std::vector<std::vector<std::pair<std::string, at::Tensor>>> params;  // [rank] full parameters at the end
  std::vector<double> global_loss() const {                             // equal slices: the global batch's mean loss
    std::vector<double> g(losses[0].size(), 0.0);
    for (const auto& l : losses)
      for (size_t s = 0; s < l.size(); ++s) g[s] += l[s] / losses.size();
    return g;
  }
};

TrainConfig config_for(const RunSpec& spec) {
  TrainConfig cfg;
  cfg.model.name = spec.model;
  cfg.model.width = 4;
  cfg.dist.strategy = spec.strategy;
  cfg.dist.fsdp_unit = spec.fsdp_unit;
  cfg.dist.bucket_mb = 0.004;  // ~1000 floats: several units, so bucketing and padding are exercised
  cfg.dist.first_bucket_mb = 0.002;
  cfg.optim.name = spec.optimizer;
  cfg.optim.lr = spec.optimizer == "adamw" ? 0.003 : 0.05;
  cfg.optim.weight_decay = spec.optimizer == "adamw" ? 0.05 : 5e-4;
  return cfg;
}

RunResult train(const RunSpec& spec) {
  const auto cfg = config_for(spec);
  std::vector<std::shared_ptr<cohort::models::Classifier>> models;
  for (int r = 0; r < spec.world; ++r) {
    torch::manual_seed(r == 0 ? 11 : 300 + r);  // different on purpose: every strategy must broadcast rank 0's
    models.push_back(cohort::models::build(cfg.model, 1, 8));
    if (spec.resume) cohort::checkpoint::load_weights(*models.back(), spec.resume->model, "test checkpoint");
  }
  const auto& data = all_data();
  RunResult out;
  out.losses.assign(spec.world, {});
  out.norms.assign(spec.world, {});
  out.params.assign(spec.world, {});
  run_ranks(spec.world, [&](int rank, CommunicatorPtr comm) {
    auto model = models[rank];
    auto strategy = cohort::train::make_strategy(cfg, model, comm);
    strategy->build_optimizer(cfg.optim);
    if (spec.resume) strategy->load_state(spec.resume->optimizer, {});
    const int64_t per_rank = kGlobalBatch / spec.world, micro = per_rank / spec.accum;
    for (int s = spec.first_step; s < spec.first_step + spec.steps; ++s) {
      double loss_sum = 0;
      for (int m = 0; m < spec.accum; ++m) {
        auto sync = strategy->gradient_sync(m == spec.accum - 1);
        const int64_t at = rank * per_rank + m * micro;
        auto loss = torch::nn::functional::cross_entropy(model->forward(data[s].x.narrow(0, at, micro)),
                                                         data[s].y.narrow(0, at, micro));
        (loss / static_cast<double>(spec.accum)).backward();
        loss_sum += loss.item<double>() / spec.accum;
      }
      out.losses[rank].push_back(loss_sum);
      out.norms[rank].push_back(strategy->step(cfg.optim.lr, {spec.clip, false}).grad_norm);
    }
    if (auto* sharded = dynamic_cast<cohort::parallel::shard::ShardedStrategy*>(strategy.get())) {
      out.params[rank] = sharded->full_parameters();
      if (!spec.save_dir.empty())
        cohort::testing::save_shards(*strategy, spec.first_step + spec.steps, spec.world, spec.save_dir, *comm);
    } else {
      for (const auto& p : model->named_parameters())
        out.params[rank].emplace_back(p.key(), p.value().detach().clone());
    }
  });
  return out;
}

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) d = std::max(d, std::abs(a[i] - b[i]));
  return d;
}

double max_param_diff(const std::vector<std::pair<std::string, at::Tensor>>& a,
                      const std::vector<std::pair<std::string, at::Tensor>>& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    d = std::max(d, (a[i].second - b[i].second).abs().max().item<double>());
  }
  return d;
}

// Note [Sharded parity tolerance]
// Sharded strategies reduce-scatter where ddp all-reduces: the same sum, in another order, so gradients
// differ in the last bits (~1e-7 relative) and those differences grow slowly over 20 steps. Losses must
// agree to 2e-5 and parameters to 1e-4 at every step; a wrong slice, a missing average or a stale
// gather is off by orders of magnitude more.
constexpr double kLossTol = 2e-5;
constexpr double kParamTol = 1e-4;

void expect_ranks_identical(const RunResult& r, const std::string& what) {
  for (size_t rank = 1; rank < r.params.size(); ++rank)
    for (size_t i = 0; i < r.params[0].size(); ++i)
      EXPECT_TRUE(torch::equal(r.params[0][i].second, r.params[rank][i].second))
          << what << ": rank " << rank << " differs from rank 0 in " << r.params[0][i].first;
}

TEST(ShardedParity, Zero1Zero2FsdpMatchDdpOn2To4RanksWithSgdAndAdamW) {
  SKIP_WITHOUT_GLOO();
  for (int world : {2, 3, 4}) {
    for (const std::string opt : {"sgd", "adamw"}) {
      RunSpec base;
      base.world = world;
      base.optimizer = opt;
      const auto ddp = train(base);
      for (const std::string strategy : {"zero1", "zero2", "fsdp"}) {
        RunSpec spec = base;
        spec.strategy = strategy;
        const auto got = train(spec);
        const std::string what = strategy + " " + opt + " on " + std::to_string(world) + " ranks";
        // Equal to ddp's within Note [Sharded parity tolerance].
        for (int r = 0; r < world; ++r) {
          EXPECT_LT(max_abs_diff(got.losses[r], ddp.losses[r]), kLossTol) << what << ", rank " << r;
        }
        EXPECT_LT(max_param_diff(got.params[0], ddp.params[0]), kParamTol) << what;
        expect_ranks_identical(got, what);
      }
    }
  }
}

TEST(ShardedParity, FsdpWithStageUnitsMatchesDdp) {
  SKIP_WITHOUT_GLOO();
  RunSpec base;
  base.world = 2;
  base.steps = 8;
  const auto ddp = train(base);
  RunSpec spec = base;
  spec.strategy = "fsdp";
  spec.fsdp_unit = "child";  // layer1..3 as units instead of each block
  const auto got = train(spec);
  EXPECT_LT(max_abs_diff(got.losses[0], ddp.losses[0]), kLossTol);
  EXPECT_LT(max_param_diff(got.params[1], ddp.params[1]), kParamTol);
}

TEST(ShardedParity, AirbenchNormLrScaleAndWhiteningFreezeMatchDdp) {
  SKIP_WITHOUT_GLOO();
  // airbench's optimizer: BatchNorm biases at 64x lr with weight decay / 64, and the whitening bias
  // frozen part way; sharded strategies group the slices of those parameters the same way.
  cohort::TrainConfig cfg;
  cfg.model.name = "airbench";
  cfg.optim.norm_lr_scale = 64;
  cfg.optim.decay_norm_and_bias = true;
  cfg.optim.lr = 0.02;
  cfg.optim.momentum = 0.85;
  cfg.dist.bucket_mb = 0.5;
  cfg.dist.first_bucket_mb = 0.25;
  torch::manual_seed(21);
  const auto x = torch::randn({8, 1, 12, 12});
  const auto y = torch::randint(0, 10, {8}, torch::kLong);
  auto run = [&](const std::string& strategy) {
    cfg.dist.strategy = strategy;
    std::vector<std::shared_ptr<cohort::models::Classifier>> models;
    for (int r = 0; r < 2; ++r) {
      torch::manual_seed(3);
      models.push_back(cohort::models::build(cfg.model, 1, 12));
    }
    std::vector<std::vector<std::pair<std::string, at::Tensor>>> params(2);
    std::vector<std::vector<double>> losses(2);
    run_ranks(2, [&](int rank, CommunicatorPtr comm) {
      auto strategy_ptr = cohort::train::make_strategy(cfg, models[rank], comm);
      strategy_ptr->build_optimizer(cfg.optim);
      at::Tensor whiten_bias_at_freeze;
      for (int s = 0; s < 4; ++s) {
        if (s == 2) strategy_ptr->freeze("whiten.bias");
        auto loss = torch::nn::functional::cross_entropy(models[rank]->forward(x.narrow(0, rank * 4, 4)),
                                                         y.narrow(0, rank * 4, 4));
        loss.backward();
        losses[rank].push_back(loss.item<double>());
        strategy_ptr->step(cfg.optim.lr, {});
      }
      if (auto* sh = dynamic_cast<cohort::parallel::shard::ShardedStrategy*>(strategy_ptr.get()))
        params[rank] = sh->full_parameters();
      else
        for (const auto& p : models[rank]->named_parameters())
          if (p.value().requires_grad()) params[rank].emplace_back(p.key(), p.value().detach().clone());
    });
    return std::make_pair(losses, params);
  };
  const auto ddp = run("ddp");
  for (const std::string strategy : {"zero2", "fsdp"}) {
    const auto got = run(strategy);
    EXPECT_LT(max_abs_diff(got.first[0], ddp.first[0]), kLossTol) << strategy;
    EXPECT_LT(max_param_diff(got.second[0], ddp.second[0]), kParamTol) << strategy;
  }
}

TEST(ShardedParity, PlansPadUnitsThatDoNotDivideByTheWorldSize) {
  // The parity test above only proves padding is handled if some unit really is padded.
  const auto cfg = config_for({});
  torch::manual_seed(1);
  auto model = cohort::models::build(cfg.model, 1, 8);
  std::vector<ParamSpec> specs;
  for (const auto& p : model->named_parameters()) specs.push_back({p.key(), p.value().sizes().vec()});
  const auto cap = static_cast<int64_t>(cfg.dist.bucket_mb * (1 << 20));
  std::vector<std::vector<size_t>> units;
  for (const auto& b : cohort::parallel::plan_buckets(specs, cap, cap)) units.push_back(b.params);
  EXPECT_GT(units.size(), 3u);
  for (int world : {3, 4}) {
    ShardPlan plan(specs, units, world);
    int padded = 0;
    for (const auto& u : plan.units()) padded += u.padded != u.numel;
    EXPECT_GT(padded, 0) << "no unit is padded at world " << world;
  }
}

TEST(ShardedParity, FsdpMatchesASingleProcessOnTheWholeBatch) {
  SKIP_WITHOUT_GLOO();
  // Without batch norm the global batch's loss and gradients do not depend on how it is split.
  RunSpec spec;
  spec.model = "mlp";
  spec.strategy = "fsdp";
  spec.world = 3;
  spec.optimizer = "adamw";
  const auto got = train(spec);

  const auto cfg = config_for(spec);
  torch::manual_seed(11);
  auto model = cohort::models::build(cfg.model, 1, 8);
  auto opt = cohort::optim::make_optimizer(
      cfg.optim, cohort::optim::split_decay(model->named_parameters(), cfg.optim.weight_decay, false));
  std::vector<double> losses;
  for (int s = 0; s < kSteps; ++s) {
    auto loss = torch::nn::functional::cross_entropy(model->forward(all_data()[s].x), all_data()[s].y);
    loss.backward();
    losses.push_back(loss.item<double>());
    opt->step(cfg.optim.lr);
    opt->zero_grad();
  }
  EXPECT_LT(max_abs_diff(got.global_loss(), losses), kLossTol);
  std::vector<std::pair<std::string, at::Tensor>> single;
  for (const auto& p : model->named_parameters()) single.emplace_back(p.key(), p.value().detach());
  EXPECT_LT(max_param_diff(got.params[0], single), kParamTol);
}

TEST(ShardedParity, ClippingUsesTheGlobalNormAcrossShards) {
  SKIP_WITHOUT_GLOO();
  RunSpec base;
  base.world = 3;
  base.clip = 0.2;  // below the gradients' norm, so every step clips
  base.steps = 8;
  const auto ddp = train(base);
  for (const std::string strategy : {"zero1", "zero2", "fsdp"}) {
    RunSpec spec = base;
    spec.strategy = strategy;
    const auto got = train(spec);
    for (int s = 0; s < base.steps; ++s) {
      EXPECT_GT(ddp.norms[0][s], base.clip);
      EXPECT_NEAR(got.norms[0][s], ddp.norms[0][s], 1e-5 * ddp.norms[0][s]) << strategy << " step " << s;
      EXPECT_EQ(got.norms[1][s], got.norms[0][s]) << "every rank must see the same global norm";
    }
    EXPECT_LT(max_abs_diff(got.losses[0], ddp.losses[0]), kLossTol) << strategy;
  }
}

TEST(ShardedParity, GradientAccumulationMatchesDdp) {
  SKIP_WITHOUT_GLOO();
  RunSpec base;
  base.world = 2;
  base.accum = 3;  // 12 images per rank: micro-batches of 4, two of them without sync
  base.steps = 8;
  base.optimizer = "adamw";
  const auto ddp = train(base);
  for (const std::string strategy : {"zero1", "zero2", "fsdp"}) {
    RunSpec spec = base;
    spec.strategy = strategy;
    const auto got = train(spec);
    EXPECT_LT(max_abs_diff(got.losses[1], ddp.losses[1]), kLossTol) << strategy;
    EXPECT_LT(max_param_diff(got.params[0], ddp.params[0]), kParamTol) << strategy;
  }
}

TEST(ShardedParity, AnInfInOneRanksSliceSkipsTheStepOnEveryRank) {
  SKIP_WITHOUT_GLOO();
  // One element of one parameter's gradient becomes inf on rank 1 only, before reduce-scatter: after it
  // only that element's owner holds an inf, and every rank must still skip (and say so).
  for (const std::string strategy : {"ddp", "zero1", "zero2", "fsdp"}) {
    RunSpec spec;
    spec.strategy = strategy;
    spec.world = 3;
    const auto cfg = config_for(spec);
    std::vector<std::shared_ptr<cohort::models::Classifier>> models;
    for (int r = 0; r < 3; ++r) {
      torch::manual_seed(8);
      models.push_back(cohort::models::build(cfg.model, 1, 8));
    }
    const auto& data = all_data();
    run_ranks(3, [&](int rank, CommunicatorPtr comm) {
      auto model = models[rank];
      auto strategy_ptr = cohort::train::make_strategy(cfg, model, comm);
      strategy_ptr->build_optimizer(cfg.optim);
      auto params_now = [&] {
        if (auto* s = dynamic_cast<cohort::parallel::shard::ShardedStrategy*>(strategy_ptr.get()))
          return s->full_parameters();
        std::vector<std::pair<std::string, at::Tensor>> out;
        for (const auto& p : model->named_parameters()) out.emplace_back(p.key(), p.value().detach().clone());
        return out;
      };
      auto train_step = [&](int s, bool inject) {
        auto w = model->named_parameters()["layer2.0.conv1.weight"];
        unsigned hook = 0;
        if (inject && rank == 1)
          hook = w.register_hook([](at::Tensor g) {
            g = g.clone();
            g.view(-1)[7] = std::numeric_limits<float>::infinity();
            return g;
          });
        auto loss = torch::nn::functional::cross_entropy(model->forward(data[s].x.narrow(0, rank * 8, 8)),
                                                         data[s].y.narrow(0, rank * 8, 8));
        loss.backward();
        if (inject && rank == 1) w.remove_hook(hook);
        return strategy_ptr->step(0.05, {0.0, /*skip_nonfinite=*/true});
      };
      auto r = train_step(0, false);
      EXPECT_FALSE(r.nonfinite) << strategy;
      const auto before = params_now();
      r = train_step(1, true);
      EXPECT_TRUE(r.nonfinite) << strategy << " rank " << rank;
      EXPECT_TRUE(r.skipped) << strategy << " rank " << rank;
      const auto after = params_now();
      EXPECT_EQ(max_param_diff(before, after), 0.0) << strategy << ": a skipped step changed parameters";
      r = train_step(2, false);  // the next step is normal again: nothing non-finite was left behind
      EXPECT_FALSE(r.nonfinite) << strategy;
      EXPECT_GT(max_param_diff(after, params_now()), 0.0) << strategy;
    });
  }
}

// ---------------------------------------------------------------------------------------------------
// FSDP memory

TrainConfig fsdp_config() {
  RunSpec spec;
  spec.strategy = "fsdp";
  return config_for(spec);
}

// `world` identical models (made before the rank threads start: the generator is global).
std::vector<std::shared_ptr<cohort::models::Classifier>> same_models(const TrainConfig& cfg, int world, uint64_t seed) {
  std::vector<std::shared_ptr<cohort::models::Classifier>> models;
  for (int r = 0; r < world; ++r) {
    torch::manual_seed(seed);
    models.push_back(cohort::models::build(cfg.model, 1, 8));
  }
  return models;
}

TEST(Fsdp, FreesEachUnitsFullParametersAfterItsForwardAndBackward) {
  SKIP_WITHOUT_GLOO();
  const auto cfg = fsdp_config();
  const auto models = same_models(cfg, 2, 5);
  const auto& data = all_data();
  run_ranks(2, [&](int rank, CommunicatorPtr comm) {
    auto model = models[rank];
    auto strategy = cohort::train::make_strategy(cfg, model, comm);
    auto* fsdp = dynamic_cast<cohort::parallel::shard::ShardedStrategy*>(strategy.get());
    ASSERT_NE(fsdp, nullptr);
    strategy->build_optimizer(cfg.optim);
    const auto& plan = fsdp->plan();
    ASSERT_EQ(plan.units().size(), 1u + 3u);  // root + resnet8's three blocks
    const int64_t root_bytes = plan.unit(0).padded * 4;
    // Blocks are whole only while they run; the root (stem and head) from the start of forward until
    // its gradients are reduced at the end of backward.
    auto check_allocated = [&](bool root, const std::string& when) {
      EXPECT_EQ(fsdp->gathered_bytes(), root ? root_bytes : 0) << when;
      EXPECT_EQ(fsdp->unit_gathered(0), root) << when;
      for (size_t u = 1; u < plan.units().size(); ++u) {
        EXPECT_FALSE(fsdp->unit_gathered(u)) << "unit " << u << " " << when;
        for (size_t p : plan.unit(u).params) {
          const auto& name = plan.params()[p].name;
          EXPECT_EQ(model->named_parameters()[name].storage().nbytes(), 0u) << name << " " << when;
        }
      }
    };
    check_allocated(false, "before the first forward");
    auto x = data[0].x.narrow(0, rank * 12, 12);
    auto loss = torch::nn::functional::cross_entropy(model->forward(x), data[0].y.narrow(0, rank * 12, 12));
    check_allocated(true, "after forward");
    loss.backward();
    check_allocated(false, "after backward");
    strategy->step(0.01, {});
    check_allocated(false, "after the step");
    {
      torch::NoGradGuard no_grad;  // evaluation frees the root too
      model->forward(x);
    }
    check_allocated(false, "after an evaluation forward");
    const auto bytes = strategy->state_bytes();
    // At rest only the master slices remain: half the model on 2 ranks, plus padding.
    EXPECT_EQ(bytes.params, plan.shard_numel() * 4);
    EXPECT_LE(bytes.grads, plan.shard_numel() * 4);
  });
}

TEST(Fsdp, PrefetchesTheNextUnitsGatherInForwardAndInBackward) {
  SKIP_WITHOUT_GLOO();
  const auto cfg = fsdp_config();
  const auto models = same_models(cfg, 2, 5);
  std::vector<std::vector<std::string>> traces(2);
  run_ranks(2, [&](int rank, CommunicatorPtr comm) {
    auto strategy = cohort::train::make_strategy(cfg, models[rank], comm);
    auto* fsdp = dynamic_cast<cohort::parallel::shard::ShardedStrategy*>(strategy.get());
    strategy->build_optimizer(cfg.optim);
    fsdp->set_tracing(true);
    auto loss = models[rank]->forward(all_data()[0].x.narrow(0, rank * 12, 12)).logsumexp(1).mean();
    loss.backward();
    traces[rank] = fsdp->trace();
  });
  const auto& t = traces[0];
  auto pos = [&](const std::string& e, size_t from = 0) {
    for (size_t i = from; i < t.size(); ++i)
      if (t[i] == e) return static_cast<long>(i);
    return -1L;
  };
  std::string all;
  for (const auto& e : t) all += e + ", ";
  // Forward: unit u+1's gather is launched before unit u runs, so it travels while u computes.
  for (int u = 1; u <= 2; ++u) {
    const long fwd = pos("forward " + std::to_string(u));
    const long next = pos("gather " + std::to_string(u + 1));
    ASSERT_GE(fwd, 0) << all;
    ASSERT_GE(next, 0) << all;
    EXPECT_LT(next, fwd) << "unit " << u + 1 << " not prefetched: " << all;
  }
  // Backward runs units 3, 2, 1: when unit u's backward starts, unit u-1's gather is launched before
  // unit u's gradients are reduced.
  for (int u = 3; u >= 2; --u) {
    const long bwd = pos("backward " + std::to_string(u));
    ASSERT_GE(bwd, 0) << all;
    const long prev = pos("gather " + std::to_string(u - 1), bwd);
    const long reduce = pos("reduce " + std::to_string(u), bwd);
    ASSERT_GE(prev, 0) << all;
    ASSERT_GE(reduce, 0) << all;
    EXPECT_LT(prev, reduce) << "unit " << u - 1 << " not prefetched in backward: " << all;
  }
  EXPECT_EQ(traces[0], traces[1]) << "ranks must issue collectives in the same order";
}

// ---------------------------------------------------------------------------------------------------
// Sharded checkpoints

struct TempDir {
  fs::path path = fs::temp_directory_path() / ("cohort_sharded_" + std::to_string(::getpid()) + "_" +
                                               ::testing::UnitTest::GetInstance()->current_test_info()->name());
  TempDir() { fs::remove_all(path); }
  ~TempDir() { fs::remove_all(path); }
};

TEST(ShardedCheckpoint, SavedAt4ResumesAt2And3WithTheUninterruptedLosses) {
  SKIP_WITHOUT_GLOO();
  TempDir tmp;
  RunSpec full;
  full.model = "mlp";  // no batch norm: the split of the batch does not change the loss
  full.strategy = "fsdp";
  full.optimizer = "adamw";
  full.world = 4;
  full.steps = 15;
  const auto uninterrupted = train(full).global_loss();

  RunSpec first = full;
  first.steps = 10;
  first.save_dir = tmp.path;
  train(first);
  for (int r = 0; r < 4; ++r) EXPECT_TRUE(fs::exists(tmp.path / cohort::checkpoint::names::shard_file("last", r, 4)));
  ASSERT_TRUE(fs::exists(tmp.path / "last.commit"));
  const auto ck = cohort::checkpoint::load_sharded(tmp.path, "last");
  EXPECT_EQ(ck.state.step, 10);
  EXPECT_EQ(ck.state.world_size, 4);

  for (int world : {2, 3}) {
    for (const std::string strategy : {"fsdp", "zero2", "ddp"}) {
      RunSpec rest = full;
      rest.strategy = strategy;
      rest.world = world;
      rest.first_step = 10;
      rest.steps = 5;
      rest.resume = &ck;
      const auto got = train(rest).global_loss();
      for (int s = 0; s < 5; ++s)
        EXPECT_NEAR(got[s], uninterrupted[10 + s], kLossTol)
            << strategy << " at " << world << " ranks, step " << 10 + s;
    }
  }
}

TEST(ShardedCheckpoint, AMissingShardOrCommitMarkerIsNamed) {
  SKIP_WITHOUT_GLOO();
  TempDir tmp;
  RunSpec spec;
  spec.strategy = "zero2";
  spec.optimizer = "sgd";
  spec.steps = 2;
  spec.save_dir = tmp.path;
  train(spec);
  const auto shard1 = tmp.path / cohort::checkpoint::names::shard_file("last", 1, 2);
  const auto kept = tmp.path / "kept";
  fs::rename(shard1, kept);
  try {
    cohort::checkpoint::load_sharded(tmp.path, "last");
    FAIL() << "a missing shard loaded";
  } catch (const cohort::CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find(shard1.filename().string()), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("rank 1 of 2"), std::string::npos) << e.what();
  }
  fs::rename(kept, shard1);
  // A shard from another save (here: rank 0's file in rank 1's place) is refused, not mixed in.
  fs::copy_file(shard1, kept);
  fs::copy_file(tmp.path / cohort::checkpoint::names::shard_file("last", 0, 2), shard1,
                fs::copy_options::overwrite_existing);
  EXPECT_THROW(cohort::checkpoint::load_sharded(tmp.path, "last"), cohort::CheckpointError);
  fs::rename(kept, shard1);
  EXPECT_NO_THROW(cohort::checkpoint::load_sharded(tmp.path, "last"));
  fs::remove(tmp.path / "last.commit");
  try {
    cohort::checkpoint::load_sharded(tmp.path, "last");
    FAIL() << "an uncommitted save loaded";
  } catch (const cohort::CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("commit marker"), std::string::npos) << e.what();
  }
}

}  // namespace

// zero1, zero2 and fsdp under amp.precision=fp16-master (Apex O2 weights: fp16 except batch norm, fp32
// masters, loss scaling) against ddp's fp16-master path on the same global batches, ranks as threads
// over Gloo. This machine's LibTorch has no fp16 matmul or convolution on CPU, so the model is made of
// elementwise ops; it still has fp16 weights with fp16 gradients from a real backward, float32
// "batch-norm" weights beside them in every block (so units split by dtype), and a size that does not
// divide by 2 or 3 (so slices are padded). The trainer refuses fp16-master on CPU; this is the same
// strategy code the GPU runs.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <map>

#include <torch/torch.h>

#include "cohort/checkpoint/ShardedCheckpoint.h"
#include "cohort/models/Models.h"
#include "cohort/parallel/shard/ShardedStrategy.h"
#include "cohort/train/StrategyFactory.h"
#include "unit/ThreadRanks.h"
#include "unit/parallel/SaveShards.h"

namespace fs = std::filesystem;
using cohort::comm::CommunicatorPtr;
using cohort::testing::run_ranks;

namespace {

constexpr int64_t kDim = 37;  // padded at 2 and 3 ranks
constexpr int64_t kClasses = 5;
constexpr int64_t kGlobalBatch = 6;
constexpr double kScale = 1024;  // a static loss scale: the dynamic one is GradScaler's, tested on its own

// Three blocks of (fp16 scale, float32 norm weight) and an fp16 head in the root unit.
class HalfNet : public cohort::models::Classifier {
 public:
  HalfNet() {
    auto list = register_module("blocks", torch::nn::ModuleList());
    for (int k = 0; k < 3; ++k) {
      auto block = std::make_shared<torch::nn::Module>();
      scales_.push_back(block->register_parameter("scale", (1.0 + 0.2 * at::randn({kDim})).to(at::kHalf)));
      norms_.push_back(block->register_parameter("norm_weight", 1.0 + 0.1 * at::randn({kDim})));
      list->push_back(block);
    }
    head_ = register_parameter("head", (0.5 * at::randn({kClasses, kDim})).to(at::kHalf));
  }
  at::Tensor forward_impl(at::Tensor x) override {
    for (size_t k = 0; k < scales_.size(); ++k)
      x = run_unit(k, [&] { return at::tanh(x * scales_[k].to(at::kFloat)) * norms_[k]; });
    return (x.unsqueeze(1) * head_.to(at::kFloat).unsqueeze(0)).sum(-1);
  }

 protected:
  std::vector<std::string> unit_prefixes(const std::string&) override {
    return {"blocks.0.", "blocks.1.", "blocks.2."};
  }

 private:
  std::vector<at::Tensor> scales_, norms_;
  at::Tensor head_;
};

struct Batch {
  at::Tensor x, y;
};
const std::vector<Batch>& all_data() {
  static const std::vector<Batch> data = [] {
    std::vector<Batch> out;
    for (int s = 0; s < 12; ++s) {
      torch::manual_seed(500 + s);
      out.push_back({torch::randn({kGlobalBatch, kDim}), torch::randint(0, kClasses, {kGlobalBatch}, torch::kLong)});
    }
    return out;
  }();
  return data;
}

using Named = std::vector<std::pair<std::string, at::Tensor>>;

struct Spec {
  std::string strategy = "ddp";
  std::string optimizer = "sgd";
  int world = 2;
  int first_step = 0;
  int steps = 8;
  double clip = 0;
  const cohort::checkpoint::Checkpoint* resume = nullptr;
  fs::path save_dir;
};

struct Result {
  std::map<std::string, at::Tensor> masters;    // float32 weights by name: the masters (or the fp32 weight)
  std::vector<double> losses;                   // the global batch's mean loss per step
  std::vector<Named> params;                    // [rank] full parameters at the end
  std::vector<std::vector<at::Tensor>> shards;  // [rank][unit] master slices a save hands over (sharded)
  std::vector<int64_t> shard_numel;             // [rank] the plan's elements per rank
};

cohort::TrainConfig config_for(const Spec& spec) {
  cohort::TrainConfig cfg;
  cfg.dist.strategy = spec.strategy;
  cfg.dist.bucket_mb = 0.0002;  // ~50 floats: several zero units per dtype
  cfg.dist.first_bucket_mb = 0.0002;
  cfg.optim.name = spec.optimizer;
  // Updates of ~1e-4 on weights near 1 are below fp16's spacing (2^-10): without float32 masters the
  // weights would not move, so parity with ddp's masters needs the sharded masters to work.
  cfg.optim.lr = spec.optimizer == "adamw" ? 1e-4 : 0.02;
  cfg.optim.weight_decay = spec.optimizer == "adamw" ? 0.01 : 0;
  return cfg;
}

Result train(const Spec& spec) {
  const auto cfg = config_for(spec);
  std::vector<std::shared_ptr<HalfNet>> models;
  for (int r = 0; r < spec.world; ++r) {
    torch::manual_seed(r == 0 ? 21 : 400 + r);  // every strategy must broadcast rank 0's weights
    models.push_back(std::make_shared<HalfNet>());
    if (spec.resume) {
      // As the trainer: the checkpoint's (float32) weights into the model, rounded to its dtypes.
      std::map<std::string, at::Tensor> saved(spec.resume->model.begin(), spec.resume->model.end());
      at::NoGradGuard no_grad;
      for (auto& p : models.back()->named_parameters()) p.value().copy_(saved.at(p.key()));
    }
  }
  const auto& data = all_data();
  Result out;
  // Sharded masters are read back through a checkpoint, whose weights are the reassembled masters.
  const fs::path save_dir = !spec.save_dir.empty()
                                ? spec.save_dir
                                : fs::temp_directory_path() / ("cohort_fp16m_run_" + std::to_string(::getpid()));
  std::vector<std::vector<double>> losses(spec.world);
  out.params.resize(spec.world);
  out.shards.resize(spec.world);
  out.shard_numel.resize(spec.world);
  run_ranks(spec.world, [&](int rank, CommunicatorPtr comm) {
    auto model = models[rank];
    auto strategy = cohort::train::make_strategy(cfg, model, comm);
    strategy->build_optimizer(cfg.optim);
    if (spec.resume) {
      auto state = spec.resume->optimizer;
      for (const auto& [name, t] : spec.resume->model) state.emplace_back("master." + name, t);  // as Trainer.cpp
      strategy->load_state(state, {});
    }
    const int64_t per_rank = kGlobalBatch / spec.world;
    for (int s = spec.first_step; s < spec.first_step + spec.steps; ++s) {
      auto loss = torch::nn::functional::cross_entropy(model->forward(data[s].x.narrow(0, rank * per_rank, per_rank)),
                                                       data[s].y.narrow(0, rank * per_rank, per_rank));
      (loss * kScale).backward();
      losses[rank].push_back(loss.item<double>());
      const auto r = strategy->step(cfg.optim.lr, {spec.clip, true, kScale});
      EXPECT_FALSE(r.skipped) << spec.strategy << " step " << s;
    }
    if (auto* sharded = dynamic_cast<cohort::parallel::shard::ShardedStrategy*>(strategy.get())) {
      out.params[rank] = sharded->full_parameters();
      out.shards[rank] = strategy->save_state().shards->params;
      out.shard_numel[rank] = sharded->plan().shard_numel();
      cohort::testing::save_shards(*strategy, spec.first_step + spec.steps, spec.world, save_dir, *comm);
    } else {
      for (const auto& p : model->named_parameters())
        out.params[rank].emplace_back(p.key(), p.value().detach().clone());
      if (rank == 0) {
        for (const auto& p : model->named_parameters()) out.masters[p.key()] = p.value().detach().to(at::kFloat);
        for (const auto& [name, t] : strategy->save_state().optimizer)
          if (name.rfind("master.", 0) == 0) out.masters[name.substr(7)] = t.clone();
      }
    }
  });
  if (spec.strategy != "ddp") {
    for (const auto& [name, t] : cohort::checkpoint::load_sharded(save_dir, "last").model) out.masters[name] = t;
    if (spec.save_dir.empty()) fs::remove_all(save_dir);
  }
  for (int s = 0; s < spec.steps; ++s) {
    double g = 0;
    for (const auto& l : losses) g += l[s] / spec.world;  // equal slices, no batch statistics
    out.losses.push_back(g);
  }
  return out;
}

// Note [fp16-master parity tolerance]
// Every strategy reduces the same fp16 gradients (divided by the world size first), but reduce-scatter
// and all-reduce may add them in another order, and one fp16 rounding differs by 2^-11 relative. The
// masters absorb that as ~1e-4 differences, and a 16-bit weight may round to the neighbouring value:
// weights agree to 2 fp16 spacings (4e-3 at 1.0) and losses to 2e-3. A weight updated in fp16 without
// a master would not have moved at all (the lr is below the spacing), and a wrong slice or a missing
// average is off by far more.
constexpr double kLossTol = 2e-3;
constexpr double kParamTol = 4e-3;
// The float32 masters see the same rounding differences only through lr x (one fp16 ulp of a gradient):
// measured at most 2.5e-5 for SGD (lr 0.02, momentum; 8 steps move them by ~1e-2) and 4e-7 for AdamW
// (lr 1e-4; 8 steps move them by up to 8e-4). A strategy that skipped the masters, a slice or a step
// would be off by the movement.
double master_tol(const std::string& optimizer) { return optimizer == "adamw" ? 1e-5 : 1e-4; }

double max_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

TEST(ShardedFp16Master, Zero1Zero2FsdpMatchDdpWithFp16WeightsAndFloat32Masters) {
  SKIP_WITHOUT_GLOO();
  for (int world : {2, 3}) {
    for (const std::string opt : {"sgd", "adamw"}) {
      Spec ref;
      ref.optimizer = opt;
      ref.world = world;
      ref.clip = opt == "sgd" ? 1.0 : 0.0;  // the global norm over fp32 gradient copies of every shard
      const auto want = train(ref);
      // The run moved the fp16 weights (the masters crossed spacings), so matching it means something.
      torch::manual_seed(21);
      const HalfNet initial;
      EXPECT_FALSE(want.params[0][0].second.equal(initial.named_parameters()[0].value())) << "ddp did not train";
      for (const std::string strategy : {"zero1", "zero2", "fsdp"}) {
        Spec spec = ref;
        spec.strategy = strategy;
        const auto got = train(spec);
        const auto what = strategy + " " + opt + " at " + std::to_string(world) + " ranks";
        // Equal to the reference within Note [fp16-master parity tolerance].
        ASSERT_EQ(got.losses.size(), want.losses.size());
        for (size_t s = 0; s < got.losses.size(); ++s)
          EXPECT_NEAR(got.losses[s], want.losses[s], kLossTol) << what << ", step " << s;
        for (size_t i = 0; i < want.params[0].size(); ++i) {
          const auto& [name, w] = want.params[0][i];
          const auto& g = got.params[0][i].second;
          EXPECT_EQ(got.params[0][i].first, name);
          EXPECT_EQ(g.scalar_type(), w.scalar_type()) << what << ": " << name << " changed dtype";
          EXPECT_LE((g.to(at::kDouble) - w.to(at::kDouble)).abs().max().item<double>(), kParamTol)
              << what << ": " << name;
          for (int r = 1; r < world; ++r)
            EXPECT_TRUE(got.params[r][i].second.equal(g)) << what << ": rank " << r << " differs in " << name;
          EXPECT_LE(max_diff(got.masters.at(name), want.masters.at(name)), master_tol(opt))
              << what << ": master of " << name;
        }
        // The masters moved: the run is not one that a frozen strategy would also match.
        torch::manual_seed(21);
        const HalfNet start;
        for (const auto& p : start.named_parameters())
          EXPECT_GT(max_diff(want.masters.at(p.key()), p.value()), 10 * master_tol(opt)) << opt << ": " << p.key();
      }
    }
  }
}

// ZeRO's layout: each rank's float32 masters cover only its slice (Ψ/N elements, with padding), and the
// 16-bit weights every rank holds are exactly those masters rounded.
TEST(ShardedFp16Master, MastersAreFloat32SlicesAndTheWeightsAreTheirRoundedValues) {
  SKIP_WITHOUT_GLOO();
  for (const std::string strategy : {"zero2", "fsdp"}) {
    Spec spec;
    spec.strategy = strategy;
    spec.world = 3;
    spec.steps = 4;
    const auto got = train(spec);
    std::map<std::string, at::Tensor> full(got.params[0].begin(), got.params[0].end());
    EXPECT_EQ(full.at("head").scalar_type(), at::kHalf);
    EXPECT_EQ(full.at("blocks.1.norm_weight").scalar_type(), at::kFloat);
    int64_t total = 0;
    for (const auto& [name, t] : full) total += t.numel();
    // Masters: one slice per unit, per rank.
    std::map<size_t, std::vector<at::Tensor>> masters;
    for (int r = 0; r < spec.world; ++r) {
      int64_t mine = 0;
      for (size_t u = 0; u < got.shards[r].size(); ++u) {
        const auto& t = got.shards[r][u];
        EXPECT_EQ(t.scalar_type(), at::kFloat) << strategy << " unit " << u;
        mine += t.numel();
        masters[u].push_back(t);
      }
      EXPECT_EQ(mine, got.shard_numel[r]) << strategy;
      EXPECT_LT(mine, total / 2) << strategy << ": rank " << r << " holds masters for more than its slice";
    }
    // Reassembled across ranks (the checkpoint's job) the masters round to the weights, in every unit.
    std::string dir = (fs::temp_directory_path() / ("cohort_fp16m_" + std::to_string(::getpid()) + strategy)).string();
    fs::remove_all(dir);
    Spec save = spec;
    save.save_dir = dir;
    train(save);
    const auto ck = cohort::checkpoint::load_sharded(dir, "last");
    bool some_master_finer = false;
    for (const auto& [name, t] : ck.model) {
      ASSERT_EQ(t.scalar_type(), at::kFloat) << name;
      const auto& w = full.at(name);
      EXPECT_TRUE(t.to(w.scalar_type()).equal(w)) << strategy << ": " << name << " is not its master rounded";
      some_master_finer |= !t.equal(w.to(at::kFloat));
    }
    EXPECT_TRUE(some_master_finer) << strategy << ": the masters hold nothing the fp16 weights do not";
    fs::remove_all(dir);
  }
}

// Saved by zero2 at 2 ranks, resumed by fsdp at 3: the masters come back from the checkpoint's float32
// weights (not from the fp16 weights rounded from them), so the run continues as if uninterrupted.
TEST(ShardedFp16Master, SavedAt2ResumesAt3WithTheMastersNotTheRoundedWeights) {
  SKIP_WITHOUT_GLOO();
  const std::string dir = (fs::temp_directory_path() / ("cohort_fp16m_resume_" + std::to_string(::getpid()))).string();
  fs::remove_all(dir);
  Spec whole;
  whole.strategy = "zero2";
  whole.optimizer = "adamw";
  whole.steps = 10;
  const auto uninterrupted = train(whole);
  Spec first = whole;
  first.steps = 5;
  first.save_dir = dir;
  train(first);
  const auto ck = cohort::checkpoint::load_sharded(dir, "last");
  // Resharded to 3 and saved again at once, the masters are bit for bit the saved ones.
  Spec reshard = whole;
  reshard.strategy = "fsdp";
  reshard.world = 3;
  reshard.first_step = 5;
  reshard.steps = 0;
  reshard.resume = &ck;
  reshard.save_dir = dir + "_again";
  train(reshard);
  const auto again = cohort::checkpoint::load_sharded(reshard.save_dir, "last");
  std::map<std::string, at::Tensor> saved(ck.model.begin(), ck.model.end());
  for (const auto& [name, t] : again.model) EXPECT_TRUE(t.equal(saved.at(name))) << name << " lost its master";
  // And so are AdamW's moments and step count.
  std::map<std::string, at::Tensor> moments(ck.optimizer.begin(), ck.optimizer.end());
  ASSERT_EQ(again.optimizer.size(), moments.size());
  for (const auto& [name, t] : again.optimizer)
    EXPECT_TRUE(t.equal(moments.at(name))) << name << " changed in the reshard";
  fs::remove_all(reshard.save_dir);
  Spec rest = reshard;
  rest.steps = 5;
  rest.save_dir.clear();
  const auto resumed = train(rest);
  for (int s = 0; s < 5; ++s) EXPECT_NEAR(resumed.losses[s], uninterrupted.losses[5 + s], kLossTol) << "step " << 5 + s;
  for (size_t i = 0; i < uninterrupted.params[0].size(); ++i)
    EXPECT_LE((resumed.params[0][i].second.to(at::kDouble) - uninterrupted.params[0][i].second.to(at::kDouble))
                  .abs()
                  .max()
                  .item<double>(),
              kParamTol)
        << uninterrupted.params[0][i].first;
  fs::remove_all(dir);
}

}  // namespace

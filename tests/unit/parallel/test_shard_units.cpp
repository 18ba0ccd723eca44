// parallel/shard/Units: how the sharded strategies cut a model into single-dtype units (ZeRO buckets
// sized in bytes, FSDP blocks split by dtype), and the replica check that includes dtypes.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "cohort/models/Models.h"
#include "cohort/parallel/shard/Units.h"
#include "cohort/util/Error.h"
#include "unit/ThreadRanks.h"

using cohort::parallel::shard::ParamSpec;
using cohort::parallel::shard::plan_units;

namespace {

// Only the unit prefixes matter to plan_units; block 2 has no parameters.
class ThreeBlocks : public cohort::models::Classifier {
 public:
  at::Tensor forward_impl(at::Tensor x) override { return x; }

 protected:
  std::vector<std::string> unit_prefixes(const std::string&) override {
    return {"blocks.0.", "blocks.1.", "blocks.2."};
  }
};

}  // namespace

TEST(ShardUnits, ZeroBucketsHoldOneDtypeAndAreSizedInBytes) {
  torch::nn::Module any;
  const std::vector<ParamSpec> specs = {{"p0", {60}, at::kHalf},  {"p1", {60}, at::kFloat}, {"p2", {60}, at::kHalf},
                                        {"p3", {60}, at::kFloat}, {"p4", {60}, at::kHalf},  {"p5", {60}, at::kHalf}};
  cohort::parallel::shard::ShardedOptions o;
  o.stage = cohort::parallel::shard::ShardStage::kZero2;
  o.bucket_mb = 400.0 / (1 << 20);  // 400 bytes: 100 float32 elements, 200 fp16 ones
  const auto layout = plan_units(any, specs, o);
  // The bucketer's units: backward order, one open unit per dtype, each closed once it holds 400 bytes
  // (fp16: 4 x 60 elements; float32: 2 x 60), in the order they were opened.
  const std::vector<std::vector<size_t>> want = {{5, 4, 2, 0}, {3, 1}};
  EXPECT_EQ(layout.units, want);
  ASSERT_EQ(layout.blocks.size(), layout.units.size());
  for (size_t u = 0; u < layout.blocks.size(); ++u) EXPECT_EQ(layout.blocks[u], std::vector<size_t>{u});
}

TEST(ShardUnits, FsdpSplitsABlockByDtypeAndKeepsEmptyBlocks) {
  ThreeBlocks model;
  const std::vector<ParamSpec> specs = {{"head", {3}, at::kHalf},
                                        {"blocks.0.w", {4}, at::kHalf},
                                        {"blocks.0.bn", {4}, at::kFloat},
                                        {"blocks.1.w", {5}, at::kHalf}};
  cohort::parallel::shard::ShardedOptions o;
  o.stage = cohort::parallel::shard::ShardStage::kFsdp;
  const auto layout = plan_units(model, specs, o);
  const std::vector<std::vector<size_t>> units = {{0}, {1}, {2}, {3}, {}};
  const std::vector<std::vector<size_t>> blocks = {{0}, {1, 2}, {3}, {4}};  // the root, then blocks 0..2
  EXPECT_EQ(layout.units, units);
  EXPECT_EQ(layout.blocks, blocks);
}

TEST(ShardUnits, ReplicasWithAnotherDtypeAreNamed) {
  SKIP_WITHOUT_GLOO();
  try {
    cohort::testing::run_ranks(2, [](int rank, cohort::comm::CommunicatorPtr comm) {
      const auto w = at::zeros({4}, rank == 0 ? at::kFloat : at::kHalf);
      cohort::parallel::check_replicas_match({{"w"}, {w}}, *comm, "zero2");
    });
    FAIL() << "ranks with different dtypes passed the check";
  } catch (const cohort::CommError& e) {
    EXPECT_NE(std::string(e.what()).find("parameter 'w' has dtype Half, rank 0's has Float"), std::string::npos)
        << e.what();
  }
}

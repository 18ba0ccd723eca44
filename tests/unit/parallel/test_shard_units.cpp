// parallel/shard/Units: how the sharded strategies cut a model into single-dtype units (ZeRO buckets
// sized in bytes, FSDP blocks split by dtype), and the replica check that includes dtypes.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "unit/ThreadRanks.h"
#include "cohort/models/Models.h"
#include "cohort/parallel/shard/Units.h"
#include "cohort/util/Error.h"

using cohort::shard::ParamSpec;
using cohort::shard::plan_units;

namespace {

// Only the unit prefixes matter to plan_units; block 2 has no parameters.
class ThreeBlocks : public cohort::models::Classifier {
 public:
  at::Tensor forward_impl(at::Tensor x) override { return x; }

 protected:
  std::vector<std::string> unit_prefixes(const std::string&) override { return {"blocks.0.", "blocks.1.", "blocks.2."}; }
};

}  // namespace

TEST(ShardUnits, ZeroBucketsHoldOneDtypeAndAreSizedInBytes) {
  torch::nn::Module any;
  const std::vector<ParamSpec> specs = {{"p0", {60}}, {"p1", {60}}, {"p2", {60}}, {"p3", {60}}, {"p4", {60}}, {"p5", {60}}};
  const std::vector<c10::ScalarType> dtypes = {at::kHalf, at::kFloat, at::kHalf, at::kFloat, at::kHalf, at::kHalf};
  cohort::ShardedOptions o;
  o.stage = cohort::ShardStage::kZero2;
  o.bucket_mb = 400.0 / (1 << 20);  // 400 bytes: 100 float32 elements, 200 fp16 ones
  const auto layout = plan_units(any, specs, dtypes, o);
  // fp16 (first seen) in backward order, cut at 200 elements; then float32, cut at 100.
  const std::vector<std::vector<size_t>> want = {{5, 4, 2}, {0}, {3}, {1}};
  EXPECT_EQ(layout.units, want);
  ASSERT_EQ(layout.blocks.size(), layout.units.size());
  for (size_t u = 0; u < layout.blocks.size(); ++u) EXPECT_EQ(layout.blocks[u], std::vector<size_t>{u});
}

TEST(ShardUnits, FsdpSplitsABlockByDtypeAndKeepsEmptyBlocks) {
  ThreeBlocks model;
  const std::vector<ParamSpec> specs = {{"head", {3}}, {"blocks.0.w", {4}}, {"blocks.0.bn", {4}}, {"blocks.1.w", {5}}};
  const std::vector<c10::ScalarType> dtypes = {at::kHalf, at::kHalf, at::kFloat, at::kHalf};
  cohort::ShardedOptions o;
  o.stage = cohort::ShardStage::kFsdp;
  const auto layout = plan_units(model, specs, dtypes, o);
  const std::vector<std::vector<size_t>> units = {{0}, {1}, {2}, {3}, {}};
  const std::vector<std::vector<size_t>> blocks = {{0}, {1, 2}, {3}, {4}};  // the root, then blocks 0..2
  EXPECT_EQ(layout.units, units);
  EXPECT_EQ(layout.blocks, blocks);
}

TEST(ShardUnits, ReplicasWithAnotherDtypeAreNamed) {
  try {
    cohort::testing::run_ranks(2, [](int rank, cohort::CommunicatorPtr comm) {
      const auto w = at::zeros({4}, rank == 0 ? at::kFloat : at::kHalf);
      cohort::shard::check_replicas_match({"w"}, {w}, *comm, "zero2");
    });
    FAIL() << "ranks with different dtypes passed the check";
  } catch (const cohort::CommError& e) {
    EXPECT_NE(std::string(e.what()).find("names, shapes or dtypes differ from rank 0's"), std::string::npos) << e.what();
  }
}

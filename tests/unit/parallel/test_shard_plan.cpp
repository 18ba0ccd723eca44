// The shard planner: padding, uneven units, ownership of every element exactly once, bucket units.
#include <gtest/gtest.h>

#include <map>
#include <vector>

#include "cohort/parallel/shard/ShardPlan.h"
#include "cohort/util/Error.h"

using cohort::parallel::shard::ParamSpec;
using cohort::parallel::shard::ShardPlan;

namespace {

// Every element of every parameter is owned by exactly one (rank, shard offset), and shards are equal.
void expect_exact_cover(const ShardPlan& plan) {
  for (size_t u = 0; u < plan.units().size(); ++u) {
    const auto& unit = plan.unit(u);
    EXPECT_EQ(unit.padded % plan.world(), 0);
    EXPECT_GE(unit.padded, unit.numel);
    EXPECT_LT(unit.padded - unit.numel, plan.world());
    std::map<size_t, std::vector<int>> owned;  // param -> owner of each element
    for (size_t p : unit.params) owned[p].assign(plan.params()[p].numel(), -1);
    for (int r = 0; r < plan.world(); ++r) {
      std::vector<bool> used(unit.shard, false);
      for (const auto& range : plan.ranges(u, r)) {
        ASSERT_LE(range.shard_offset + range.length, unit.shard);
        ASSERT_LE(range.param_offset + range.length, plan.params()[range.param].numel());
        for (int64_t i = 0; i < range.length; ++i) {
          EXPECT_EQ(owned[range.param][range.param_offset + i], -1) << "element owned twice";
          owned[range.param][range.param_offset + i] = r;
          EXPECT_FALSE(used[range.shard_offset + i]) << "shard slot used twice";
          used[range.shard_offset + i] = true;
        }
      }
    }
    for (auto& [p, owners] : owned)
      for (int o : owners) EXPECT_GE(o, 0) << "an element of " << plan.params()[p].name << " has no owner";
  }
}

TEST(ShardPlan, PadsUnevenUnitsAndCoversEveryElementOnce) {
  const std::vector<ParamSpec> params = {{"a", {7, 3}}, {"b", {5}}, {"c", {2, 2, 2}}, {"d", {1}}, {"e", {13}}};
  for (int world : {1, 2, 3, 4, 5, 8, 64}) {
    ShardPlan plan(params, {{0, 1}, {2, 3, 4}}, world);
    expect_exact_cover(plan);
    EXPECT_EQ(plan.total_numel(), 21 + 5 + 8 + 1 + 13);
  }
  ShardPlan three(params, {{0, 1}, {2, 3, 4}}, 3);
  EXPECT_EQ(three.unit(0).numel, 26);
  EXPECT_EQ(three.unit(0).padded, 27);  // one element of padding
  EXPECT_EQ(three.unit(0).shard, 9);
  // Rank 2 owns a[18..20] and all of b at shard offsets 0..7; slot 8 is padding.
  const auto r2 = three.ranges(0, 2);
  ASSERT_EQ(r2.size(), 2u);
  EXPECT_EQ(r2[0].param, 0u);
  EXPECT_EQ(r2[0].param_offset, 18);
  EXPECT_EQ(r2[0].length, 3);
  EXPECT_EQ(r2[1].param, 1u);
  EXPECT_EQ(r2[1].shard_offset, 3);
  EXPECT_EQ(r2[1].length, 5);
  EXPECT_EQ(three.unit_of(3), 1u);
}

TEST(ShardPlan, MoreRanksThanElementsLeavesSomeShardsPaddingOnly) {
  ShardPlan plan({{"x", {3}}}, {{0}}, 8);
  expect_exact_cover(plan);
  EXPECT_EQ(plan.unit(0).shard, 1);
  EXPECT_TRUE(plan.ranges(0, 5).empty());
}

TEST(ShardPlan, RejectsAParameterInTwoUnitsOrInNone) {
  const std::vector<ParamSpec> params = {{"a", {2}}, {"b", {2}}};
  EXPECT_THROW(ShardPlan(params, {{0, 1}, {1}}, 2), cohort::Error);
  try {
    ShardPlan(params, {{0}}, 2);
    FAIL() << "no error for a parameter in no unit";
  } catch (const cohort::Error& e) {
    EXPECT_NE(std::string(e.what()).find("'b' is in no unit"), std::string::npos) << e.what();
  }
}

}  // namespace

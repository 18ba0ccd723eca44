#include <gtest/gtest.h>

#include <set>

#include "cohort/parallel/BucketPlan.h"

using cohort::parallel::ParamSpec;
using cohort::parallel::plan_buckets;

TEST(BucketPlan, ReverseOrderFirstBucketSmall) {
  // 10 float params of 100 elements (400 B). First cap 800 B, then 2000 B.
  std::vector<ParamSpec> ps(10, ParamSpec{"p", {100}, at::kFloat});
  const auto plan = plan_buckets(ps, 2000, 800);
  ASSERT_EQ(plan.size(), 3u);
  EXPECT_EQ(plan[0].params, (std::vector<size_t>{9, 8}));
  EXPECT_EQ(plan[1].params, (std::vector<size_t>{7, 6, 5, 4, 3}));
  EXPECT_EQ(plan[2].params, (std::vector<size_t>{2, 1, 0}));
  EXPECT_EQ(plan[1].offsets, (std::vector<int64_t>{0, 100, 200, 300, 400}));
  EXPECT_EQ(plan[1].numel, 500);
}

TEST(BucketPlan, EveryParamExactlyOnceAndDtypesSeparate) {
  std::vector<ParamSpec> ps;
  for (int i = 0; i < 50; ++i) ps.push_back({"p", {(i * 37) % 101 + 1}, i % 3 == 0 ? at::kDouble : at::kFloat});
  const auto plan = plan_buckets(ps, 300, 100);
  std::multiset<size_t> seen;
  for (const auto& b : plan) {
    int64_t offset = 0;
    for (size_t k = 0; k < b.params.size(); ++k) {
      EXPECT_EQ(ps[b.params[k]].dtype, b.dtype);
      EXPECT_EQ(b.offsets[k], offset);
      offset += ps[b.params[k]].numel();
      seen.insert(b.params[k]);
    }
    EXPECT_EQ(offset, b.numel);
  }
  EXPECT_EQ(seen.size(), ps.size());
  for (size_t i = 0; i < ps.size(); ++i) EXPECT_EQ(seen.count(i), 1u);
}

TEST(BucketPlan, OversizedParamGetsItsOwnBucketAndPlanIsDeterministic) {
  std::vector<ParamSpec> ps{{"a", {10}, at::kFloat}, {"b", {1000000}, at::kFloat}, {"c", {10}, at::kFloat}};
  const auto a = plan_buckets(ps, 1024, 1024);
  const auto b = plan_buckets(ps, 1024, 1024);
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a[0].params, (std::vector<size_t>{2, 1}));
  EXPECT_EQ(a[1].params, (std::vector<size_t>{0}));
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].params, b[i].params);
}

TEST(BucketPlan, ALastCapMakesTheLastBucketTheFirstParametersUpToIt) {
  // 10 float params of 100 elements (400 B). First cap 800 B, then 2000 B, last cap 800 B: params 0 and 1
  // (the first registered, whose gradients come last) form the last bucket, in arrival order; the rest
  // are planned as without it.
  std::vector<ParamSpec> ps(10, ParamSpec{"p", {100}, at::kFloat});
  const auto plan = plan_buckets(ps, 2000, 800, 800);
  ASSERT_EQ(plan.size(), 4u);
  EXPECT_EQ(plan[0].params, (std::vector<size_t>{9, 8}));
  EXPECT_EQ(plan[1].params, (std::vector<size_t>{7, 6, 5, 4, 3}));
  EXPECT_EQ(plan[2].params, (std::vector<size_t>{2}));
  EXPECT_EQ(plan[3].params, (std::vector<size_t>{1, 0}));
  EXPECT_EQ(plan[3].offsets, (std::vector<int64_t>{0, 100}));
  // Mixed dtypes: one small last bucket per dtype; every parameter exactly once.
  std::vector<ParamSpec> mixed;
  for (int i = 0; i < 12; ++i) mixed.push_back({"p", {100}, i % 2 ? at::kDouble : at::kFloat});
  std::multiset<size_t> seen;
  for (const auto& b : plan_buckets(mixed, 2000, 800, 800))
    for (size_t k : b.params) seen.insert(k);
  EXPECT_EQ(seen.size(), mixed.size());
  for (size_t i = 0; i < mixed.size(); ++i) EXPECT_EQ(seen.count(i), 1u);
}

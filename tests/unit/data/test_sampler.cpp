// DistributedSampler as a pure plan: every rank's shard is computed here in one process, as each rank
// would compute it on its own, and checked against PyTorch's DistributedSampler semantics.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <set>
#include <vector>

#include "cohort/data/DistributedSampler.h"
#include "cohort/util/Error.h"

using cohort::data::DistributedSampler;

namespace {

constexpr uint64_t kSeed = 1234;

std::vector<std::vector<int64_t>> all_shards(int64_t n, int world, int64_t epoch, bool drop_last, bool shuffle = true,
                                             uint64_t seed = kSeed) {
  std::vector<std::vector<int64_t>> shards;
  for (int r = 0; r < world; ++r) {
    // A fresh sampler per rank: nothing is shared between "ranks" but the constructor arguments.
    shards.push_back(DistributedSampler(n, world, r, shuffle, seed, drop_last).indices(epoch));
  }
  return shards;
}

struct Case {
  int64_t n;
  int world;
};

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (int64_t n : {10, 11, 60000}) {
    for (int w : {1, 2, 3}) cases.push_back({n, w});
  }
  return cases;
}

}  // namespace

TEST(DistributedSampler, PaddedShardsCoverEverythingWithEqualCounts) {
  for (const Case c : all_cases()) {
    SCOPED_TRACE("N=" + std::to_string(c.n) + " W=" + std::to_string(c.world));
    const auto shards = all_shards(c.n, c.world, /*epoch=*/0, /*drop_last=*/false);
    const int64_t per_rank = (c.n + c.world - 1) / c.world;
    std::vector<int64_t> seen(static_cast<size_t>(c.n), 0);
    for (const auto& s : shards) {
      ASSERT_EQ(static_cast<int64_t>(s.size()), per_rank);
      for (int64_t i : s) {
        ASSERT_GE(i, 0);
        ASSERT_LT(i, c.n);
        ++seen[static_cast<size_t>(i)];
      }
    }
    // Everything is covered; padding repeats exactly total - N samples once more.
    const int64_t padding = per_rank * c.world - c.n;
    int64_t twice = 0;
    for (int64_t k : seen) {
      ASSERT_GE(k, 1);
      ASSERT_LE(k, 2);
      twice += k - 1;
    }
    EXPECT_EQ(twice, padding);
    if (c.n % c.world == 0) {
      // Disjoint shards: no sample appears on two ranks.
      EXPECT_EQ(padding, 0);
      std::set<int64_t> uni;
      for (const auto& s : shards) uni.insert(s.begin(), s.end());
      EXPECT_EQ(static_cast<int64_t>(uni.size()), c.n);
    }
  }
}

TEST(DistributedSampler, DropLastTruncatesToEqualDisjointShards) {
  for (const Case c : all_cases()) {
    SCOPED_TRACE("N=" + std::to_string(c.n) + " W=" + std::to_string(c.world));
    const auto shards = all_shards(c.n, c.world, /*epoch=*/3, /*drop_last=*/true);
    const int64_t per_rank = c.n / c.world;
    std::set<int64_t> uni;
    for (const auto& s : shards) {
      ASSERT_EQ(static_cast<int64_t>(s.size()), per_rank);
      uni.insert(s.begin(), s.end());
    }
    // Always disjoint with drop_last, and exactly N mod W samples skipped this epoch.
    EXPECT_EQ(static_cast<int64_t>(uni.size()), per_rank * c.world);
    EXPECT_EQ(c.n - static_cast<int64_t>(uni.size()), c.n % c.world);
    EXPECT_EQ(DistributedSampler(c.n, c.world, 0, true, kSeed, true).num_samples(), per_rank);
  }
}

TEST(DistributedSampler, ShardsInterleaveTheSharedPermutation) {
  for (const Case c : all_cases()) {
    SCOPED_TRACE("N=" + std::to_string(c.n) + " W=" + std::to_string(c.world));
    for (bool drop_last : {false, true}) {
      // Each rank computes the permutation independently; all agree.
      std::vector<std::vector<int64_t>> perms;
      for (int r = 0; r < c.world; ++r) {
        perms.push_back(DistributedSampler(c.n, c.world, r, true, kSeed, drop_last).permutation(5));
      }
      for (const auto& p : perms) ASSERT_EQ(p, perms[0]);
      std::vector<int64_t> sorted = perms[0];
      std::sort(sorted.begin(), sorted.end());
      for (int64_t i = 0; i < c.n; ++i) ASSERT_EQ(sorted[static_cast<size_t>(i)], i);

      // Rank r's k-th sample is position r + k*W of the padded (repeated from the start) permutation.
      const auto shards = all_shards(c.n, c.world, 5, drop_last);
      for (int r = 0; r < c.world; ++r) {
        for (size_t k = 0; k < shards[static_cast<size_t>(r)].size(); ++k) {
          const int64_t pos = r + static_cast<int64_t>(k) * c.world;
          ASSERT_EQ(shards[static_cast<size_t>(r)][k], perms[0][static_cast<size_t>(pos % c.n)]);
        }
      }
    }
  }
}

TEST(DistributedSampler, PaddingRepeatsFromTheStart) {
  // N=10, W=3: total 12, so the first two permutation entries are appended.
  const DistributedSampler s0(10, 3, 0, true, kSeed, false);
  const std::vector<int64_t> perm = s0.permutation(0);
  EXPECT_EQ(s0.total_size(), 12);
  EXPECT_EQ(s0.num_samples(), 4);
  const auto shards = all_shards(10, 3, 0, false);
  EXPECT_EQ(shards[1].back(), perm[0]);  // position 10
  EXPECT_EQ(shards[2].back(), perm[1]);  // position 11
  // More ranks than samples: padding wraps around the permutation more than once.
  const auto tiny = all_shards(2, 5, 0, false);
  const std::vector<int64_t> p2 = DistributedSampler(2, 5, 0, true, kSeed, false).permutation(0);
  for (int r = 0; r < 5; ++r) {
    ASSERT_EQ(tiny[static_cast<size_t>(r)].size(), 1u);
    EXPECT_EQ(tiny[static_cast<size_t>(r)][0], p2[static_cast<size_t>(r % 2)]);
  }
}

TEST(DistributedSampler, DeterministicPerEpochAndDifferentAcrossEpochs) {
  for (const Case c : all_cases()) {
    SCOPED_TRACE("N=" + std::to_string(c.n) + " W=" + std::to_string(c.world));
    const DistributedSampler a(c.n, c.world, 0, true, kSeed, false);
    const DistributedSampler b(c.n, c.world, 0, true, kSeed, false);
    EXPECT_EQ(a.indices(2), b.indices(2));
    // Order of calls does not matter: an epoch's plan depends only on (seed, epoch).
    const auto e7 = a.indices(7);
    (void)a.indices(1);
    EXPECT_EQ(a.indices(7), e7);
    EXPECT_NE(a.permutation(0), a.permutation(1));
    EXPECT_NE(a.permutation(0), DistributedSampler(c.n, c.world, 0, true, kSeed + 1, false).permutation(0));
  }
}

TEST(DistributedSampler, NoShuffleIsIdentityOrder) {
  const auto shards = all_shards(11, 3, 4, false, /*shuffle=*/false);
  EXPECT_EQ(shards[0], (std::vector<int64_t>{0, 3, 6, 9}));
  EXPECT_EQ(shards[1], (std::vector<int64_t>{1, 4, 7, 10}));
  EXPECT_EQ(shards[2], (std::vector<int64_t>{2, 5, 8, 0}));
  const auto dropped = all_shards(11, 3, 4, true, false);
  EXPECT_EQ(dropped[2], (std::vector<int64_t>{2, 5, 8}));
}

TEST(DistributedSampler, ShuffleIsNotTrivial) {
  // A real shuffle of 60000 moves almost everything; a bug drawing j from a too-small range would not.
  const std::vector<int64_t> p = DistributedSampler(60000, 1, 0, true, kSeed, false).permutation(0);
  int64_t fixed = 0;
  for (int64_t i = 0; i < 60000; ++i) fixed += p[static_cast<size_t>(i)] == i;
  EXPECT_LT(fixed, 20);
  // Uniformity smoke test: position 0 over many epochs of N=10 hits every value.
  std::vector<int> first(10, 0);
  const DistributedSampler s(10, 1, 0, true, kSeed, false);
  for (int64_t e = 0; e < 2000; ++e) ++first[static_cast<size_t>(s.permutation(e)[0])];
  for (int v : first) {
    EXPECT_GT(v, 140);
    EXPECT_LT(v, 260);
  }
}

TEST(DistributedSampler, EvalIndicesCountEachSampleOnce) {
  for (const Case c : all_cases()) {
    SCOPED_TRACE("N=" + std::to_string(c.n) + " W=" + std::to_string(c.world));
    std::vector<int> seen(static_cast<size_t>(c.n), 0);
    int64_t total = 0;
    for (int r = 0; r < c.world; ++r) {
      const auto e = DistributedSampler(c.n, c.world, r, true, kSeed, true).eval_indices();
      EXPECT_TRUE(std::is_sorted(e.begin(), e.end()));
      // Counts differ by at most one between ranks.
      EXPECT_LE(static_cast<int64_t>(e.size()), c.n / c.world + 1);
      EXPECT_GE(static_cast<int64_t>(e.size()), c.n / c.world);
      for (int64_t i : e) ++seen[static_cast<size_t>(i)];
      total += static_cast<int64_t>(e.size());
    }
    EXPECT_EQ(total, c.n);
    for (int k : seen) ASSERT_EQ(k, 1);
  }
}

TEST(DistributedSampler, NumBatches) {
  const DistributedSampler s(60000, 3, 1, true, kSeed, false);  // 20000 per rank
  EXPECT_EQ(s.num_batches(128, false), 157);
  EXPECT_EQ(s.num_batches(128, true), 156);
  EXPECT_EQ(s.num_batches(20000, true), 1);
  const DistributedSampler t(11, 2, 0, true, kSeed, false);  // 6 per rank
  EXPECT_EQ(t.num_batches(4, false), 2);
  EXPECT_EQ(t.num_batches(4, true), 1);
  EXPECT_THROW(t.num_batches(0, false), cohort::ConfigError);
}

TEST(DistributedSampler, RejectsEmptyPlans) {
  EXPECT_THROW(DistributedSampler(0, 1, 0, true, kSeed, false), cohort::ConfigError);
  EXPECT_THROW(DistributedSampler(2, 3, 0, true, kSeed, true), cohort::ConfigError);
  EXPECT_THROW(DistributedSampler(10, 2, 2, true, kSeed, false), std::logic_error);  // rank out of range
}

// PyTorch's own order, pinned: torch.randperm(60000) from a generator seeded with 5 (DistributedSampler's
// seed + epoch) begins as below in Python's torch 1.13 (Debian 12), 2.6 (Debian 13) and 2.14 (pip),
// checked when this test was written; so on whichever LibTorch this runs, cohort's order is PyTorch's.
// tests/reference/sampler.py compares every rank with torch.utils.data.DistributedSampler itself.
TEST(DistributedSampler, ShuffledOrderIsTorchRandpermOfSeedPlusEpoch) {
  const DistributedSampler s(60000, 1, 0, /*shuffle=*/true, /*seed=*/2, /*drop_last=*/false);
  const auto perm = s.permutation(/*epoch=*/3);
  EXPECT_EQ(std::vector<int64_t>(perm.begin(), perm.begin() + 5),
            (std::vector<int64_t>{53411, 765, 31431, 44421, 31202}));
  const DistributedSampler small(10, 1, 0, true, 7, false);
  EXPECT_EQ(small.permutation(0), (std::vector<int64_t>{5, 0, 3, 4, 1, 7, 9, 6, 8, 2}));
}

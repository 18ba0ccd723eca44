// The batch-size search, pure: over a synthetic "fits" function (the real trials are covered by the
// process tests).
#include <gtest/gtest.h>

#include "cohort/commands/BatchSizeFinder.h"
#include "cohort/util/Error.h"

using namespace cohort::commands;

namespace {
// Runs the search against "a batch fits when it is at most `limit`", recording the batches tried.
FindResult search(int64_t limit, FindOptions o, std::vector<int64_t>* tried = nullptr, int64_t dataset = 1 << 30) {
  return find_batch_size(o, [&](int64_t b) {
    if (tried) tried->push_back(b);
    Trial t;
    t.batch = b;
    t.fits = b <= limit && b <= dataset;
    t.dataset_limit = b > dataset;
    return t;
  });
}
}  // namespace

TEST(BatchSizeFinder, DoublesThenBisectsToTheExactLimit) {
  std::vector<int64_t> tried;
  const auto r = search(37, FindOptions{}, &tried);
  EXPECT_EQ(r.batch_size, 37);
  EXPECT_EQ(r.limited_by, "memory");
  EXPECT_EQ(tried, (std::vector<int64_t>{2, 4, 8, 16, 32, 64, 48, 40, 36, 38, 37}));
  for (int64_t limit : {1, 2, 3, 5, 64, 65, 1000, 4097}) {
    const auto q = search(limit, FindOptions{});
    EXPECT_EQ(q.batch_size, limit) << limit;
    // The answer fits and the next batch was tried and did not.
    bool saw_next = false;
    for (const auto& t : q.trials) saw_next |= t.batch == limit + 1 && !t.fits;
    EXPECT_TRUE(saw_next) << limit;
  }
}

TEST(BatchSizeFinder, StopsAtMaxBatchDatasetAndTrialBudget) {
  FindOptions o;
  o.max_batch = 100;
  auto r = search(1000, o);
  EXPECT_EQ(r.batch_size, 100);
  EXPECT_EQ(r.limited_by, "max_batch");
  r = search(1000, FindOptions{}, nullptr, /*dataset=*/300);
  EXPECT_EQ(r.batch_size, 300);
  EXPECT_EQ(r.limited_by, "dataset");
  o = FindOptions{};
  o.max_trials = 4;
  r = search(37, o);
  EXPECT_EQ(r.trials.size(), 4u);
  EXPECT_EQ(r.batch_size, 16);
  EXPECT_EQ(r.limited_by, "max_trials");
  r = search(0, FindOptions{});  // nothing fits, not even 1
  EXPECT_EQ(r.batch_size, 0);
  EXPECT_EQ(r.trials.back().batch, 1);
}

TEST(BatchSizeFinder, ParsesMemorySizes) {
  EXPECT_EQ(parse_bytes("1048576"), 1048576);
  EXPECT_EQ(parse_bytes("512M"), 512LL << 20);
  EXPECT_EQ(parse_bytes("512MiB"), 512LL << 20);
  EXPECT_EQ(parse_bytes("4g"), 4LL << 30);
  EXPECT_EQ(parse_bytes("1.5GB"), 3LL << 29);
  EXPECT_EQ(parse_bytes("2T"), 2LL << 40);
  for (const char* bad : {"", "G", "-1G", "4X", "four"}) EXPECT_THROW(parse_bytes(bad), cohort::ConfigError) << bad;
}

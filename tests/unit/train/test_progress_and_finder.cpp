// Rank 0's progress bar text and the batch-size search, both pure: the bar from a state, the search over
// a synthetic "fits" function (the real trials are covered by the process tests).
#include <gtest/gtest.h>

#include <sstream>

#include "cohort/train/BatchSizeFinder.h"
#include "cohort/train/Progress.h"
#include "cohort/util/Error.h"

using namespace cohort::train;

TEST(Progress, ModeFollowsTheTerminalUnlessForced) {
  EXPECT_EQ(Progress::resolve("auto", true), Progress::Mode::kBar);
  EXPECT_EQ(Progress::resolve("auto", false), Progress::Mode::kPlain);
  EXPECT_EQ(Progress::resolve("bar", false), Progress::Mode::kBar);
  EXPECT_EQ(Progress::resolve("plain", true), Progress::Mode::kPlain);
  EXPECT_EQ(Progress::resolve("off", true), Progress::Mode::kOff);
}

TEST(Progress, ClockFormatsLikeTqdm) {
  EXPECT_EQ(Progress::clock(0), "00:00");
  EXPECT_EQ(Progress::clock(309), "05:09");
  EXPECT_EQ(Progress::clock(3723), "1:02:03");
  EXPECT_EQ(Progress::clock(NAN), "?");
}

TEST(Progress, BarShowsFractionEtaLossAndThroughput) {
  ProgressState s;
  s.epoch = 1, s.epochs = 3, s.step_in_epoch = 50, s.steps_per_epoch = 100;
  s.step = 150, s.total_steps = 300, s.loss = 0.4321, s.images_per_second = 612;
  s.elapsed_s = 30, s.steps_this_session = 150;  // 0.2 s a step, 150 to go: 30 s
  const std::string bar = Progress::render(s, 80);
  EXPECT_EQ(bar.rfind("epoch 2/3 [", 0), 0u) << bar;
  EXPECT_NE(bar.find(" 50% 50/100 loss 0.4321 612 img/s 00:30<00:30"), std::string::npos) << bar;
  const auto open = bar.find('['), close = bar.find(']');
  const std::string cells = bar.substr(open + 1, close - open - 1);
  EXPECT_EQ(std::count(cells.begin(), cells.end(), '#'), static_cast<long>(cells.size() / 2)) << bar;
  EXPECT_LE(bar.size(), 80u);
  // A resumed run has done no steps in this process yet: the ETA is unknown, not zero.
  s.steps_this_session = 0;
  EXPECT_NE(Progress::render(s, 80).find("<?"), std::string::npos);
}

TEST(Progress, PlainAndOffModesDrawNoBar) {
  std::ostringstream out;
  Progress plain(Progress::Mode::kPlain, out);
  plain.update(ProgressState{});
  plain.end_epoch();
  EXPECT_EQ(out.str(), "");
  Progress bar(Progress::Mode::kBar, out);
  bar.update(ProgressState{});
  bar.end_epoch();
  EXPECT_EQ(out.str().rfind("\repoch 1/1 [", 0), 0u);
  EXPECT_EQ(out.str().back(), '\n');
}

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

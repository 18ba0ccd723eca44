// Rank 0's progress bar text, pure: the bar from a state.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "cohort/record/Progress.h"

using namespace cohort::record;

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

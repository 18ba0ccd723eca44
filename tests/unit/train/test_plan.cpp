// make_plan (train/Setup.h): how many steps a run makes and what its schedule spans, for whole and
// fractional train.epochs and with train.max_steps.
#include <gtest/gtest.h>

#include "cohort/data/DistributedSampler.h"
#include "cohort/train/Setup.h"

namespace cohort {
namespace {

using train::make_plan;

// 60,000 images over 2 ranks in batches of 128: 234 steps an epoch (the default job's shape).
train::Plan plan_for(double epochs, int64_t max_steps = 0) {
  TrainConfig cfg;
  cfg.data.batch_size = 128;
  cfg.train.epochs = epochs;
  cfg.train.max_steps = max_steps;
  comm::WorldInfo info;
  info.world_size = 2;
  const data::DistributedSampler sampler(60000, 2, 0, true, 0, true);
  return make_plan(cfg, sampler, info);
}

TEST(Plan, WholeEpochsMakeThatManyPasses) {
  const auto p = plan_for(3);
  EXPECT_EQ(p.steps_per_epoch, 234);
  EXPECT_EQ(p.total_steps, 702);
  EXPECT_EQ(p.stop_step, 702);
  EXPECT_EQ(p.epochs(), 3);
}

// As Hugging Face Trainer's num_train_epochs: 2.7 passes end the third at 70% of its steps, and the
// schedule (OneCycle's anneal included) ends there too, not at the third pass's end.
TEST(Plan, AFractionEndsTheLastPassEarlyAndTheScheduleWithIt) {
  const auto p = plan_for(2.7);
  EXPECT_EQ(p.total_steps, 632);  // round(2.7 x 234) = round(631.8)
  EXPECT_EQ(p.stop_step, 632);
  EXPECT_EQ(p.epochs(), 3);
  const auto whole = plan_for(3);
  EXPECT_LT(p.schedule.lr(631), whole.schedule.lr(631));  // annealed to its end by step 632
  EXPECT_DOUBLE_EQ(p.schedule.lr(631), whole.schedule.lr(701));
  EXPECT_EQ(plan_for(0.5).epochs(), 1);
  EXPECT_EQ(plan_for(0.5).total_steps, 117);
  EXPECT_EQ(plan_for(0.001).total_steps, 1);  // never zero steps
}

TEST(Plan, MaxStepsStopsEarlyButTheScheduleStillSpansTheEpochs) {
  const auto p = plan_for(2.7, 100);
  EXPECT_EQ(p.stop_step, 100);
  EXPECT_EQ(p.total_steps, 632);
}

}  // namespace
}  // namespace cohort

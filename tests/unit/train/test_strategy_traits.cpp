// strategy_traits (train/StrategyFactory.h): what each strategy decides for the loop (Note [What the
// strategy decides for the loop] in parallel/Strategy.h): the data's share and pace, leaving on a
// signal, the trackers' grouping, and one collective at a time.
#include <gtest/gtest.h>

#include "cohort/train/StrategyFactory.h"

namespace cohort {
namespace {

using train::strategy_traits;

TrainConfig with(const std::string& strategy) {
  TrainConfig cfg;
  cfg.dist.strategy = strategy;
  cfg.train.seed = 7;
  cfg.data.batch_size = 32;
  return cfg;
}

TEST(StrategyTraits, FixedGroupsShareTheDataByRankAndStopTogether) {
  for (const auto* name : {"ddp", "zero1", "zero2", "fsdp"}) {
    const auto t = strategy_traits(with(name), 2, 4);
    EXPECT_EQ(t.data_parts, 4) << name;
    EXPECT_EQ(t.data_part, 2) << name;
    EXPECT_EQ(t.data_seed, 7u) << name;
    EXPECT_EQ(t.endless_step_samples, 0) << name;
    EXPECT_FALSE(t.leaves_alone) << name;
    EXPECT_FALSE(t.groups_runs) << name;
    EXPECT_FALSE(t.one_collective_at_a_time) << name;
  }
}

TEST(StrategyTraits, OnlyDdpInBackwardTakesOneCollectiveAtATime) {
  auto ddp = with("ddp"), zero2 = with("zero2");
  ddp.optim.in_backward = zero2.optim.in_backward = true;
  EXPECT_TRUE(strategy_traits(ddp, 0, 2).one_collective_at_a_time);
  EXPECT_FALSE(strategy_traits(zero2, 0, 2).one_collective_at_a_time);
}

TEST(StrategyTraits, SwarmPartitionsAreEveryPeersRanks) {
  for (const auto* name : {"swarm", "diloco"}) {
    auto cfg = with(name);
    cfg.swarm.sampler = "partition";
    cfg.swarm.partitions = 3;
    cfg.swarm.partition = 1;
    const auto t = strategy_traits(cfg, 1, 2);
    EXPECT_EQ(t.data_parts, 6) << name;
    EXPECT_EQ(t.data_part, 3) << name;
    EXPECT_EQ(t.data_seed, 7u) << name;
    EXPECT_EQ(t.endless_step_samples, 0) << name;
    EXPECT_TRUE(t.leaves_alone) << name;
    EXPECT_TRUE(t.groups_runs) << name;
  }
}

TEST(StrategyTraits, ARandomSwarmSamplerIsEndlessUnderThePeersOwnSeed) {
  auto swarm = with("swarm");
  swarm.swarm.sampler = "random";
  swarm.swarm.listen = "127.0.0.2:7000";
  const auto t = strategy_traits(swarm, 0, 2);
  EXPECT_EQ(t.data_parts, 2);
  EXPECT_NE(t.data_seed, 7u);
  swarm.swarm.listen = "127.0.0.3:7000";
  EXPECT_NE(strategy_traits(swarm, 0, 2).data_seed, t.data_seed) << "two peers drew the same order";
  EXPECT_EQ(t.endless_step_samples, 64) << "swarm.target_batch_size=0: a batch of every worker";
  swarm.swarm.target_batch_size = 500;
  EXPECT_EQ(strategy_traits(swarm, 0, 2).endless_step_samples, 500);
  // DiLoCo's peers take epochs of the whole set, each under its own seed.
  auto diloco = swarm;
  diloco.dist.strategy = "diloco";
  EXPECT_EQ(strategy_traits(diloco, 0, 2).endless_step_samples, 0);
}

}  // namespace
}  // namespace cohort

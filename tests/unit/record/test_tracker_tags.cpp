// What a tracker's run is tagged with (record/RunLog.h): the job's facts, and for a swarm or DiLoCo peer
// one name its whole job shares, whatever each machine's own keys say.
#include <gtest/gtest.h>

#include <map>

#include "cohort/config/Config.h"
#include "cohort/record/RunLog.h"
#include "cohort/train/StrategyFactory.h"

namespace {

std::map<std::string, std::string> tags_of(const std::vector<std::string>& overrides) {
  const auto cfg = cohort::config::load(std::nullopt, overrides);
  const auto json = cohort::config::to_json(cfg);
  std::map<std::string, std::string> out;
  const bool groups = cohort::train::strategy_traits(cfg, 0, 2).groups_runs;
  for (const auto& [k, v] : cohort::record::tracker_tags({cfg, json, 2, "cohort", "ddp", "bf16", "runs/a", groups}))
    out[k] = v;
  return out;
}

}  // namespace

TEST(TrackerTags, NameTheJobsFacts) {
  const auto tags = tags_of({});
  EXPECT_EQ(tags.at("cohort.world_size"), "2");
  EXPECT_EQ(tags.at("cohort.strategy"), "ddp");
  EXPECT_EQ(tags.at("cohort.precision"), "bf16");
  EXPECT_EQ(tags.at("cohort.launcher"), "cohort");
  EXPECT_EQ(tags.at("cohort.version"), COHORT_VERSION);
  EXPECT_EQ(tags.count("cohort.swarm"), 0u) << "a fixed group is one run";
}

TEST(TrackerTags, ThePeersOfOneSwarmShareOneNameAndAnotherJobGetsAnother) {
  const std::vector<std::string> swarm = {"dist.strategy=swarm", "swarm.insecure=true"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), swarm.begin(), swarm.end());
    return tags_of(more).at("cohort.swarm");
  };
  const auto first = with({"swarm.listen=10.0.0.1:7000", "data.workers=2"});
  EXPECT_EQ(first.rfind("swarm-", 0), 0u) << first;
  EXPECT_EQ(with({"swarm.listen=10.0.0.2:7000", "swarm.initial_peers=10.0.0.1:7000", "data.workers=4"}), first)
      << "machine-local keys differ between peers of one job";
  EXPECT_NE(with({"swarm.listen=10.0.0.1:7000", "optim.lr=0.1"}), first) << "another job's config";
}

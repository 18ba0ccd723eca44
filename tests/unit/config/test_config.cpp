#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "cohort/config/Config.h"
#include "cohort/util/Error.h"

namespace cfg = cohort::config;

namespace {
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const cohort::ConfigError& e) {
    return e.describe();
  }
  return "no error";
}
}  // namespace

TEST(Config, DefaultsAreTheDefaultJob) {
  const auto c = cfg::load(std::nullopt, {});
  EXPECT_EQ(c.model.name, "resnet8");
  EXPECT_EQ(c.data.name, "fashion-mnist");
  EXPECT_DOUBLE_EQ(c.dist.bucket_mb, 25.0);
  EXPECT_EQ(c.ckpt.every_steps, 0);
  EXPECT_DOUBLE_EQ(c.train.epochs, 2.7);  // docs/default-job.md
  EXPECT_DOUBLE_EQ(c.optim.lr, 1.2);
}

TEST(Config, OverridesApplyInOrder) {
  const auto c = cfg::load(std::nullopt, {"data.batch_size=64", "train.epochs=2", "data.batch_size=32",
                                          "optim.nesterov=false", "sched.name=cosine", "optim.lr=0.05"});
  EXPECT_EQ(c.data.batch_size, 32);
  EXPECT_EQ(c.train.epochs, 2);
  EXPECT_DOUBLE_EQ(cfg::load(std::nullopt, {"train.epochs=2.5"}).train.epochs, 2.5);
  EXPECT_FALSE(c.optim.nesterov);
  EXPECT_EQ(c.sched.name, "cosine");
  EXPECT_DOUBLE_EQ(c.optim.lr, 0.05);
}

TEST(Config, TomlFileThenCommandLine) {
  const auto path = std::filesystem::temp_directory_path() / "cohort_cfg_test.toml";
  std::ofstream(path) << "[data]\nbatch_size = 96\naugment = false\n[optim]\nlr = 0.3\n[model]\nname = \"mlp\"\n";
  const auto c = cfg::load(path, {"optim.lr=0.4"});
  EXPECT_EQ(c.data.batch_size, 96);
  EXPECT_FALSE(c.data.augment);
  EXPECT_DOUBLE_EQ(c.optim.lr, 0.4);
  EXPECT_EQ(c.model.name, "mlp");
}

TEST(Config, UnknownKeyIsNamedWithSuggestion) {
  const auto m = error_of([] { cfg::load(std::nullopt, {"data.batchsize=3"}); });
  EXPECT_NE(m.find("unknown config key 'data.batchsize'"), std::string::npos) << m;
  EXPECT_NE(m.find("data.batch_size"), std::string::npos) << m;
}

TEST(Config, BadValuesAreNamed) {
  for (const std::string o :
       {"data.batch_size=abc", "data.batch_size=-3", "optim.lr=0", "optim.nesterov=maybe", "model.name=vgg",
        "optim.momentum=1.5", "train.seed=-1", "train.epochs=0", "train.epochs=2e6", "train.epochs=inf"}) {
    const auto key = o.substr(0, o.find('='));
    const auto m = error_of([&] { cfg::load(std::nullopt, {o}); });
    EXPECT_NE(m.find("'" + key + "'"), std::string::npos) << o << ": " << m;
    EXPECT_NE(m.find("bad value"), std::string::npos) << o << ": " << m;
  }
  EXPECT_NE(error_of([] { cfg::load(std::nullopt, {"no-equals-sign"}); }).find("key=value"), std::string::npos);
}

TEST(Config, BadTomlNamesFileAndLine) {
  const auto path = std::filesystem::temp_directory_path() / "cohort_cfg_bad.toml";
  std::ofstream(path) << "[data]\nbatch_size = = 3\n";
  const auto m = error_of([&] { cfg::load(path, {}); });
  EXPECT_NE(m.find(path.string() + ":2"), std::string::npos) << m;
  std::ofstream(path) << "[data]\nbatch_sise = 3\n";
  const auto m2 = error_of([&] { cfg::load(path, {}); });
  EXPECT_NE(m2.find("data.batch_sise"), std::string::npos) << m2;
  EXPECT_NE(m2.find(path.string()), std::string::npos) << m2;
}

TEST(Config, HelpListsEveryKeyWithDefault) {
  const auto help = cfg::help_text();
  for (const auto& k : cfg::keys()) {
    EXPECT_NE(help.find(k.key + " (" + k.type), std::string::npos) << k.key;
    EXPECT_FALSE(k.help.empty()) << k.key;
  }
  for (const char* required :
       {"model.name", "data.name", "data.root", "data.batch_size", "data.augment", "train.epochs", "train.max_steps",
        "train.seed", "optim.lr", "optim.momentum", "optim.nesterov", "optim.weight_decay", "sched.name",
        "loss.label_smoothing", "dist.bucket_mb", "dist.backend", "dist.timeout_s", "ckpt.every_steps", "run.dir"})
    EXPECT_NE(help.find(std::string(required) + " ("), std::string::npos) << required;
}

TEST(Config, JsonRoundTrip) {
  const auto c = cfg::load(std::nullopt, {"data.batch_size=17", "optim.lr=0.123", "model.name=mlp", "train.seed=99"});
  const auto back = cfg::from_json(cfg::to_json(c));
  EXPECT_EQ(cfg::to_json(back), cfg::to_json(c));
}

TEST(Config, CompressionKeysParseAndBadValuesNameTheKey) {
  const auto c = cfg::load(std::nullopt, {"dist.compress=powersgd", "powersgd.rank=2", "powersgd.start_iter=350",
                                          "powersgd.warm_start=false"});
  EXPECT_EQ(c.dist.compress, "powersgd");
  EXPECT_EQ(c.powersgd.rank, 2);
  EXPECT_EQ(c.powersgd.start_iter, 350);
  EXPECT_FALSE(c.powersgd.warm_start);
  EXPECT_TRUE(c.powersgd.error_feedback);
  auto m = error_of([] { cfg::load(std::nullopt, {"dist.compress=gzip"}); });
  EXPECT_NE(m.find("dist.compress"), std::string::npos) << m;
  EXPECT_NE(m.find("powersgd"), std::string::npos) << m;  // lists the choices
  m = error_of([] { cfg::load(std::nullopt, {"powersgd.rank=0"}); });
  EXPECT_NE(m.find("powersgd.rank"), std::string::npos) << m;
}

TEST(Config, SwarmCompressTakesNoneFp16OrInt8AndNamesTheKeyOtherwise) {
  EXPECT_EQ(cfg::load(std::nullopt, {}).swarm.compress, "none");
  EXPECT_EQ(cfg::load(std::nullopt, {"swarm.compress=fp16"}).swarm.compress, "fp16");
  EXPECT_EQ(cfg::load(std::nullopt, {"swarm.compress=int8"}).swarm.compress, "int8");
  const auto m = error_of([] { cfg::load(std::nullopt, {"swarm.compress=int4"}); });
  EXPECT_NE(m.find("swarm.compress"), std::string::npos) << m;
  EXPECT_NE(m.find("fp16"), std::string::npos) << m;  // lists the choices
}

TEST(Config, SwarmAverageStateEveryTakesZeroForTheStrategysOwnAndRefusesNegatives) {
  EXPECT_EQ(cfg::load(std::nullopt, {}).swarm.average_state_every, 0);
  EXPECT_EQ(cfg::load(std::nullopt, {"swarm.average_state_every=5"}).swarm.average_state_every, 5);
  const auto m = error_of([] { cfg::load(std::nullopt, {"swarm.average_state_every=-1"}); });
  EXPECT_NE(m.find("swarm.average_state_every"), std::string::npos) << m;
}

TEST(Config, ShardingAndOptimizerKeysParseAndConflictsAreNamed) {
  const auto c = cfg::load(std::nullopt, {"dist.strategy=fsdp", "dist.fsdp_unit=child", "optim.name=adamw",
                                          "optim.beta2=0.95", "optim.clip_grad_norm=1.5"});
  EXPECT_EQ(c.dist.strategy, "fsdp");
  EXPECT_EQ(c.dist.fsdp_unit, "child");
  EXPECT_EQ(c.optim.name, "adamw");
  EXPECT_DOUBLE_EQ(c.optim.beta2, 0.95);
  EXPECT_DOUBLE_EQ(c.optim.clip_grad_norm, 1.5);
  EXPECT_EQ(cfg::load(std::nullopt, {}).dist.strategy, "ddp");
  auto m = error_of([] { cfg::load(std::nullopt, {"dist.strategy=zero3"}); });
  EXPECT_NE(m.find("dist.strategy"), std::string::npos) << m;
  EXPECT_NE(m.find("fsdp"), std::string::npos) << m;  // lists the choices
  m = error_of([] { cfg::load(std::nullopt, {"dist.strategy=zero2", "dist.compress=fp16"}); });
  EXPECT_NE(m.find("works with dist.strategy=ddp only"), std::string::npos) << m;
  m = error_of([] { cfg::load(std::nullopt, {"dist.strategy=zero1", "train.lookahead=true"}); });
  EXPECT_NE(m.find("train.lookahead works with dist.strategy=ddp only"), std::string::npos) << m;
  m = error_of([] { cfg::load(std::nullopt, {"optim.name=lamb"}); });
  EXPECT_NE(m.find("optim.name"), std::string::npos) << m;
}

TEST(Config, DifferingKeysIgnoreMachineLocalOnes) {
  const auto a = cfg::to_json(cfg::load(std::nullopt, {"data.root=/a", "train.threads=2"}));
  const auto b =
      cfg::to_json(cfg::load(std::nullopt, {"data.root=/b", "train.threads=4", "data.batch_size=64", "optim.lr=0.1"}));
  EXPECT_EQ(cfg::differing_keys(a, b), (std::vector<std::string>{"data.batch_size", "optim.lr"}));
  EXPECT_TRUE(cfg::differing_keys(a, a).empty());
}

// Every ready config under configs/ loads: keys exist, values have their types, cross-key checks pass.
TEST(Config, EveryShippedConfigLoads) {
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(std::filesystem::path(COHORT_SOURCE_DIR) / "configs")) {
    if (e.path().extension() != ".toml") continue;
    ++files;
    EXPECT_NO_THROW(cohort::config::load(e.path(), {})) << e.path();
  }
  EXPECT_GE(files, 4);
}

// Note [toml++ 3.3 and non-ASCII text]: non-ASCII text stays allowed where TOML allows it (quoted values,
// keys, comments) and is refused, with line and column, where toml++ 3.3 would reach undefined behaviour.
TEST(Config, NonAsciiIsReadInStringsAndCommentsAndRefusedElsewhere) {
  const auto ok = cfg::load_from_string(
      "# données\n[data]\nroot = \"/données/é\"\n'name' = 'mnist' # ü\n"
      "[model]\nname = 'resnet8'\n",
      "ok.toml", {});
  EXPECT_EQ(ok.data.root, "/données/é");
  EXPECT_EQ(ok.data.name, "mnist");
  for (const std::string bad : {"[data]\nroot = é\n", "[model]\nname =+'d\xc3\x80'\n", "[data]\nroot = \"x\" é\n"}) {
    try {
      cfg::load_from_string(bad, "bad.toml", {});
      FAIL() << "accepted: " << bad;
    } catch (const cohort::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("bad.toml:"), std::string::npos) << e.what();
    }
  }
}

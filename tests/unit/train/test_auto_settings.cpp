// amp.precision=auto and train.channels_last=auto (Note [What auto picks] in train/AutoSettings.h): the
// decision for every CUDA capability class and for CPUs with and without native bf16, the kernel-flag
// probe on recorded /proc/cpuinfo lines, the COHORT_CPU_BF16 mask, and explicit settings winning.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "cohort/config/Config.h"
#include "cohort/train/AutoSettings.h"
#include "cohort/util/Error.h"

namespace cohort {
namespace {

namespace fs = std::filesystem;
using train::Hardware;

Hardware gpu(int major, int minor) {
  Hardware hw;
  hw.cuda = true, hw.cuda_major = major, hw.cuda_minor = minor, hw.cuda_name = "GPU";
  return hw;
}

Hardware cpu(bool bf16) {
  Hardware hw;
  hw.cpu_bf16 = bf16;
  hw.cpu_bf16_source = bf16 ? "the CPU has AVX512-BF16" : "the CPU has no native bf16";
  return hw;
}

fs::path cpuinfo_file(const std::string& name, const std::string& text) {
  const auto p = fs::temp_directory_path() / ("cohort-cpuinfo-" + name);
  std::ofstream(p) << text;
  return p;
}

// Restores COHORT_CPU_BF16 after a test that sets it.
struct MaskEnv {
  explicit MaskEnv(const char* value) { setenv("COHORT_CPU_BF16", value, 1); }
  ~MaskEnv() { unsetenv("COHORT_CPU_BF16"); }
};

TEST(AutoPrecision, EveryCudaCapabilityClass) {
  // Kepler, Maxwell, Pascal, Volta, Turing (T4): no bf16 arithmetic. Ampere, Ada, Hopper, Blackwell: bf16.
  const std::vector<std::pair<std::pair<int, int>, std::string>> table = {
      {{3, 7}, "fp16-master"}, {{5, 2}, "fp16-master"}, {{6, 0}, "fp16-master"}, {{6, 1}, "fp16-master"},
      {{7, 0}, "fp16-master"}, {{7, 5}, "fp16-master"}, {{8, 0}, "bf16"},        {{8, 6}, "bf16"},
      {{8, 9}, "bf16"},        {{9, 0}, "bf16"},        {{10, 0}, "bf16"},       {{12, 0}, "bf16"}};
  for (const auto& [cc, want] : table) {
    const auto c = train::choose_precision(gpu(cc.first, cc.second), /*why_not_fp16_master=*/"");
    EXPECT_EQ(c.value, want) << cc.first << "." << cc.second;
    EXPECT_TRUE(c.automatic);
    EXPECT_NE(c.why.find(std::to_string(cc.first) + "." + std::to_string(cc.second)), std::string::npos) << c.why;
  }
  // fp16-master cannot average its own fp16 weights (train.lookahead) nor feed fp16 gradients to a
  // compression hook: fp16 autocast instead.
  EXPECT_EQ(train::choose_precision(gpu(7, 5), "train.lookahead averages the weights themselves").value, "fp16");
  EXPECT_EQ(train::choose_precision(gpu(8, 0), "train.lookahead averages the weights themselves").value, "bf16");
  EXPECT_EQ(train::fp16_master_unsuitable(config::load(std::nullopt, {})), "");
  EXPECT_NE(train::fp16_master_unsuitable(config::load(std::nullopt, {"train.lookahead=true"})), "");
  EXPECT_NE(train::fp16_master_unsuitable(config::load(std::nullopt, {"dist.compress=powersgd"})), "");
  EXPECT_NE(train::fp16_master_unsuitable(config::load(std::nullopt, {"dist.compress=bf16"})), "");
  TrainConfig compressing = config::load(std::nullopt, {"dist.compress=powersgd"});
  train::resolve_auto(compressing, gpu(7, 5));
  EXPECT_EQ(compressing.amp.precision, "fp16");
}

TEST(AutoPrecision, CpuWithAndWithoutNativeBf16) {
  EXPECT_EQ(train::choose_precision(cpu(true), "").value, "bf16");
  const auto none = train::choose_precision(cpu(false), "");
  EXPECT_EQ(none.value, "fp32");
  EXPECT_NE(none.why.find("slower than fp32"), std::string::npos) << none.why;
}

// Native bf16 units whose measured peak is not kCpuBf16MinSpeedup times fp32's: fp32, saying both figures
// (2026-12-02: an Intel Xeon with AVX512-BF16 and no AMX enabled); at or past it, bf16 with the ratio.
TEST(AutoPrecision, CpuBf16MustMeasureFasterThanFp32) {
  auto slow = cpu(true);
  slow.cpu_bf16_flops = 82e9, slow.cpu_fp32_flops = 110e9;
  const auto fp32 = train::choose_precision(slow, "");
  EXPECT_EQ(fp32.value, "fp32");
  EXPECT_NE(fp32.why.find("AVX512-BF16, but here bf16 measured 82 GFLOP/s and fp32 110 GFLOP/s"), std::string::npos)
      << fp32.why;
  EXPECT_NE(fp32.why.find("bf16 needs 1.25x fp32's"), std::string::npos) << fp32.why;
  auto fast = cpu(true);
  fast.cpu_bf16_flops = 428e9, fast.cpu_fp32_flops = 100e9;
  const auto bf16 = train::choose_precision(fast, "");
  EXPECT_EQ(bf16.value, "bf16");
  EXPECT_NE(bf16.why.find("measured 4.28x fp32's speed here"), std::string::npos) << bf16.why;
  auto edge = cpu(true);
  edge.cpu_bf16_flops = train::kCpuBf16MinSpeedup * 100e9, edge.cpu_fp32_flops = 100e9;
  EXPECT_EQ(train::choose_precision(edge, "").value, "bf16");
  auto unmeasured = cpu(true);  // a peak of 0: the flags alone decide, as with COHORT_CPU_BF16 set
  unmeasured.cpu_fp32_flops = 100e9;
  EXPECT_EQ(train::choose_precision(unmeasured, "").value, "bf16");
  auto none = cpu(false);  // no native units: fp32, whatever a peak says
  none.cpu_bf16_flops = 500e9, none.cpu_fp32_flops = 100e9;
  EXPECT_EQ(train::choose_precision(none, "").value, "fp32");
}

TEST(AutoLayout, ChannelsLastForConvNetsWhereItIsFaster) {
  for (const std::string m : {"resnet8", "resnet20", "resnet18", "resnet50", "airbench"}) {
    EXPECT_EQ(train::choose_channels_last(cpu(false), m, "fp32").value, "true") << m;
    EXPECT_EQ(train::choose_channels_last(gpu(7, 0), m, "bf16").value, "true") << m;
    EXPECT_EQ(train::choose_channels_last(gpu(6, 1), m, "fp16-master").value, "false") << m;
  }
  for (const std::string m : {"vit_b32", "mlp"}) {
    EXPECT_EQ(train::choose_channels_last(cpu(true), m, "bf16").value, "false") << m;
    EXPECT_EQ(train::choose_channels_last(gpu(9, 0), m, "bf16").value, "false") << m;
  }
}

// Note [Channels-last on a CPU without AVX-512]: fp32 stays contiguous there, bf16 does not.
TEST(AutoLayout, Fp32WithoutAvx512KeepsTheContiguousLayout) {
  auto avx2 = cpu(false);
  avx2.cpu_wide_vectors = false;
  const auto fp32 = train::choose_channels_last(avx2, "resnet8", "fp32");
  EXPECT_EQ(fp32.value, "false");
  EXPECT_NE(fp32.why.find("AVX-512"), std::string::npos) << fp32.why;
  EXPECT_EQ(train::choose_channels_last(avx2, "resnet8", "bf16").value, "true");
  EXPECT_EQ(train::choose_channels_last(gpu(8, 0), "resnet8", "fp32").value, "true") << "a GPU's layout is its own";
  const auto x86 = [](const std::string& flags) { return "processor\t: 0\nflags\t\t: fpu sse2 " + flags + "\n"; };
  EXPECT_FALSE(train::probe_cpu(cpuinfo_file("zen3", x86("avx2 fma")).string()).cpu_wide_vectors);
  EXPECT_TRUE(train::probe_cpu(cpuinfo_file("skx2", x86("avx2 avx512f")).string()).cpu_wide_vectors);
  EXPECT_TRUE(
      train::probe_cpu(cpuinfo_file("arm2", "processor\t: 0\nFeatures\t: fp asimd\n").string()).cpu_wide_vectors);
}

TEST(AutoSettings, ExplicitValuesWinAndAutoIsReplaced) {
  TrainConfig cfg = config::load(std::nullopt, {});
  EXPECT_EQ(cfg.amp.precision, "auto");
  EXPECT_EQ(cfg.train.channels_last, "auto");
  auto s = train::resolve_auto(cfg, cpu(true));
  EXPECT_EQ(cfg.amp.precision, "bf16");
  EXPECT_EQ(cfg.train.channels_last, "true");
  EXPECT_TRUE(s.precision.automatic);
  EXPECT_TRUE(train::channels_last(cfg));
  EXPECT_NE(train::describe(s).find("precision bf16 (auto: the CPU has AVX512-BF16)"), std::string::npos)
      << train::describe(s);

  TrainConfig pinned = config::load(std::nullopt, {"amp.precision=fp32", "train.channels_last=false"});
  s = train::resolve_auto(pinned, cpu(true));
  EXPECT_EQ(pinned.amp.precision, "fp32");
  EXPECT_FALSE(train::channels_last(pinned));
  EXPECT_FALSE(s.precision.automatic);
  EXPECT_EQ(train::describe(s), "precision fp32 (set explicitly), contiguous layout (set explicitly)");

  TrainConfig unresolved;
  EXPECT_THROW(train::channels_last(unresolved), std::logic_error);  // COHORT_ASSERT: a bug, not a user error
}

TEST(AutoSettings, CpuProbeReadsTheKernelFlags) {
  const auto x86 = [](const std::string& flags) {
    return "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse2 avx2 " + flags + "\nbugs\t\t: none\n";
  };
  EXPECT_TRUE(train::probe_cpu(cpuinfo_file("amx", x86("avx512f amx_bf16 amx_tile avx512_bf16")).string()).cpu_bf16);
  const auto zen4 = train::probe_cpu(cpuinfo_file("zen4", x86("avx512f avx512_bf16 avx512_vnni")).string());
  EXPECT_TRUE(zen4.cpu_bf16);
  EXPECT_EQ(zen4.cpu_bf16_source, "the CPU has AVX512-BF16");
  const auto skylake = train::probe_cpu(cpuinfo_file("skx", x86("avx512f avx512bw avx512_vnni")).string());
  EXPECT_FALSE(skylake.cpu_bf16);
  EXPECT_NE(skylake.cpu_bf16_source.find("no native bf16"), std::string::npos);
  EXPECT_TRUE(
      train::probe_cpu(cpuinfo_file("arm", "processor\t: 0\nFeatures\t: fp asimd bf16 i8mm\n").string()).cpu_bf16);
  const auto missing = train::probe_cpu("/nonexistent/cpuinfo");
  EXPECT_FALSE(missing.cpu_bf16);
  EXPECT_NE(missing.cpu_bf16_source.find("/nonexistent/cpuinfo"), std::string::npos);
}

TEST(AutoSettings, MaskForcesEachCpuBranch) {
  const auto with_bf16 = cpuinfo_file("mask", "flags\t\t: avx512f avx512_bf16\n").string();
  {
    MaskEnv mask("0");
    const auto hw = train::probe_cpu(with_bf16);
    EXPECT_FALSE(hw.cpu_bf16);
    EXPECT_NE(hw.cpu_bf16_source.find("COHORT_CPU_BF16=0 masks it"), std::string::npos) << hw.cpu_bf16_source;
    TrainConfig cfg;
    train::resolve_auto(cfg, hw);
    EXPECT_EQ(cfg.amp.precision, "fp32");
  }
  {
    MaskEnv claim("1");
    EXPECT_TRUE(train::probe_cpu(cpuinfo_file("none", "flags\t\t: sse2\n").string()).cpu_bf16);
  }
}

TEST(AutoSettings, ChannelsLastKeyTakesAutoAndAnyBoolSpelling) {
  EXPECT_EQ(config::load(std::nullopt, {"train.channels_last=on"}).train.channels_last, "true");
  EXPECT_EQ(config::load(std::nullopt, {"train.channels_last=0"}).train.channels_last, "false");
  EXPECT_EQ(config::load(std::nullopt, {"train.channels_last=AUTO"}).train.channels_last, "auto");
  try {
    config::load(std::nullopt, {"train.channels_last=sometimes"});
    FAIL() << "accepted train.channels_last=sometimes";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("expected auto, true or false"), std::string::npos) << e.what();
  }
  // A config.json written before the key took auto holds a bool.
  auto j = config::to_json(TrainConfig{});
  j["train.channels_last"] = true;
  j["amp.precision"] = "fp32";
  const auto old = config::from_json(j);
  EXPECT_EQ(old.train.channels_last, "true");
  EXPECT_EQ(old.amp.precision, "fp32");
  EXPECT_THROW(config::load(std::nullopt, {"amp.precision=fastest"}), ConfigError);
}

}  // namespace
}  // namespace cohort

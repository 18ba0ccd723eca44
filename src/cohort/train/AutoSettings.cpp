#include "cohort/train/AutoSettings.h"

#include <cstdlib>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>

#include <ATen/Parallel.h>
#include <nlohmann/json.hpp>

#include "cohort/log/Peak.h"
#include "cohort/train/RankAgreement.h"
#include "cohort/util/Error.h"

#ifdef COHORT_HAVE_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

namespace cohort::train {
namespace {

bool is_conv_net(const std::string& model) { return model.rfind("resnet", 0) == 0 || model == "airbench"; }

std::string capability(const Hardware& hw) {
  return std::to_string(hw.cuda_major) + "." + std::to_string(hw.cuda_minor);
}

AutoChoice kept(const std::string& value) { return {value, "set explicitly", false}; }

// "1.25x", "0.68x".
std::string ratio_text(double r) {
  std::ostringstream s;
  s << std::fixed;
  s.precision(2);
  s << r << "x";
  return s.str();
}

}  // namespace

std::optional<std::string> cpu_bf16_override() {
  const char* mask = std::getenv("COHORT_CPU_BF16");
  if (mask && (std::string(mask) == "0" || std::string(mask) == "1")) return std::string(mask);
  return std::nullopt;
}

void measure_cpu_bf16_against_fp32(Hardware& hw) {
  if (hw.cuda || !hw.cpu_bf16 || cpu_bf16_override()) return;
  const auto cache = log::peak_cache_file();
  hw.cpu_bf16_flops = log::cpu_peak("bfloat16", at::get_num_threads(), cache).flops;
  hw.cpu_fp32_flops = log::cpu_peak("float32", at::get_num_threads(), cache).flops;
}

Hardware probe_cpu(const std::string& cpuinfo_path) {
  Hardware hw;
  const auto flags = log::kernel_cpu_flags(cpuinfo_path);
  // x86 lists "sse2"; Arm's "Features" line does not.
  hw.cpu_wide_vectors = flags.count("avx512f") > 0 || (!flags.empty() && flags.count("sse2") == 0);
  if (flags.empty()) {
    hw.cpu_bf16_source = "no CPU feature flags in " + cpuinfo_path;
  } else if (flags.count("amx_bf16")) {
    hw.cpu_bf16 = true, hw.cpu_bf16_source = "the CPU has AMX-BF16";
  } else if (flags.count("avx512_bf16")) {
    hw.cpu_bf16 = true, hw.cpu_bf16_source = "the CPU has AVX512-BF16";
  } else if (flags.count("bf16")) {  // Arm's FEAT_BF16
    hw.cpu_bf16 = true, hw.cpu_bf16_source = "the CPU has Arm BF16";
  } else {
    hw.cpu_bf16_source = "the CPU has no native bf16 (no AMX-BF16, AVX512-BF16 or Arm BF16)";
  }
  if (const auto mask = cpu_bf16_override()) {
    hw.cpu_bf16 = *mask == "1";
    hw.cpu_bf16_source += std::string(", but COHORT_CPU_BF16=") + *mask + (hw.cpu_bf16 ? " claims it" : " masks it");
  }
  return hw;
}

Hardware probe_hardware(const c10::Device& device) {
  Hardware hw = probe_cpu();
  if (device.is_cuda()) {
    hw.cuda = true;
#ifdef COHORT_HAVE_CUDA
    const auto* prop = at::cuda::getDeviceProperties(device.index());
    hw.cuda_major = prop->major;
    hw.cuda_minor = prop->minor;
    hw.cuda_name = prop->name;
#endif
  }
  return hw;
}

AutoChoice choose_precision(const Hardware& hw, const std::string& why_not_fp16_master) {
  if (hw.cuda) {
    const std::string gpu =
        (hw.cuda_name.empty() ? "the GPU" : hw.cuda_name) + " (compute capability " + capability(hw) + ")";
    if (hw.cuda_major >= 8) return {"bf16", gpu + " computes in bf16", true};
    // Before Ampere there is no bf16 arithmetic; fp16 needs loss scaling, and fp32 masters keep small
    // updates from vanishing in fp16 weights (Apex O2, what the seed's T4 machines needed).
    if (!why_not_fp16_master.empty())
      return {"fp16", gpu + " has no bf16; fp16 autocast because " + why_not_fp16_master, true};
    return {"fp16-master", gpu + " has no bf16", true};
  }
  if (hw.cpu_bf16 && hw.cpu_bf16_flops > 0 && hw.cpu_fp32_flops > 0) {  // Note [What auto picks]
    const double speedup = hw.cpu_bf16_flops / hw.cpu_fp32_flops;
    if (speedup >= kCpuBf16MinSpeedup)
      return {"bf16", hw.cpu_bf16_source + ", measured " + ratio_text(speedup) + " fp32's speed here", true};
    const auto gflops = [](double f) { return std::to_string(static_cast<int64_t>(f / 1e9)) + " GFLOP/s"; };
    return {"fp32",
            hw.cpu_bf16_source + ", but here bf16 measured " + gflops(hw.cpu_bf16_flops) + " and fp32 " +
                gflops(hw.cpu_fp32_flops) + " (peaks.json): bf16 needs " + ratio_text(kCpuBf16MinSpeedup) + " fp32's",
            true};
  }
  if (hw.cpu_bf16) return {"bf16", hw.cpu_bf16_source, true};
  return {"fp32", hw.cpu_bf16_source + "; emulated bf16 is slower than fp32", true};
}

// Note [Channels-last on a CPU without AVX-512]
// On the CPU channels-last pays through oneDNN's NHWC convolutions, its AVX-512 and AMX kernels. On an
// AMD EPYC with AVX2 only, Debian 12's oneDNN 2.6 (LibTorch 1.13) corrupted the heap ("double free or
// corruption", SIGABRT) in the backward of fp32 NHWC convolutions of resnet8 at width 4 on Fashion-MNIST,
// with one thread a worker: 3 runs of 3; contiguous, two threads, bf16 or width 32 did not. So without
// AVX-512, fp32 keeps the contiguous layout, ATen's own path; bf16 keeps NHWC. It costs the default job
// (width 32) there 0.91x channels-last's images/s (2 pairs of 30 steps: 229 and 234 against 253 and 255).
AutoChoice choose_channels_last(const Hardware& hw, const std::string& model_name, const std::string& precision) {
  if (!is_conv_net(model_name)) return {"false", model_name + " is not a convolutional model", true};
  if (!hw.cuda && !hw.cpu_wide_vectors && precision == "fp32")
    return {"false", "fp32 on a CPU without AVX-512: oneDNN's NHWC kernels are its AVX-512 ones", true};
  if (!hw.cuda) return {"true", "convolutional model on CPU: oneDNN's NHWC kernels", true};
  if (hw.cuda_major >= 7) return {"true", "convolutional model on tensor cores: compute capability 7.0 on", true};
  return {"false", "compute capability " + capability(hw) + " has no tensor cores", true};
}

std::string fp16_master_unsuitable(const TrainConfig& cfg) {
  if (cfg.train.lookahead) return "train.lookahead averages the weights themselves";
  // fp16-master's gradients are fp16: PowerSGD would fall back to a plain all-reduce, and a 16-bit
  // all-reduce of them would only round them again.
  if (cfg.dist.compress != "none") return "dist.compress=" + cfg.dist.compress + " compresses fp32 gradients";
  return "";
}

AutoSettings resolve_auto(TrainConfig& cfg, const Hardware& hw) {
  AutoSettings s;
  s.precision =
      cfg.amp.precision == "auto" ? choose_precision(hw, fp16_master_unsuitable(cfg)) : kept(cfg.amp.precision);
  // fp16 needs loss scaling, which the optimizer inside backward cannot use (Config.cpp's validate).
  if (cfg.amp.precision == "auto" && cfg.optim.in_backward && s.precision.value.rfind("fp16", 0) == 0)
    s.precision = {"fp32", s.precision.why + "; fp32 because optim.in_backward cannot use fp16 loss scaling", true};
  s.channels_last = cfg.train.channels_last == "auto" ? choose_channels_last(hw, cfg.model.name, s.precision.value)
                                                      : kept(cfg.train.channels_last);
  cfg.amp.precision = s.precision.value;
  cfg.train.channels_last = s.channels_last.value;
  return s;
}

namespace {

nlohmann::json choice_json(const AutoChoice& c) { return {{"value", c.value}, {"why", c.why}, {"auto", c.automatic}}; }
AutoChoice choice_from(const nlohmann::json& j) { return {j.at("value"), j.at("why"), j.at("auto")}; }

// A resumed run trains on in the precision and layout it started with, whatever this machine would pick.
void keep_saved_choices(TrainConfig& cfg, const std::string& saved_config_json, AutoSettings& kept_from_save) {
  if (saved_config_json.empty()) return;
  const auto saved = nlohmann::json::parse(saved_config_json, nullptr, /*allow_exceptions=*/false);
  if (!saved.is_object()) return;
  auto keep = [&](std::string& value, const char* key, AutoChoice& out) {
    if (!saved.contains(key)) return;
    const auto& v = saved.at(key);
    const std::string s = v.is_string() ? v.get<std::string>() : v.dump();  // older saves hold a bool
    if (s == "auto") return;
    // `cohort train --resume` makes the saved config.json the base, so the value is already the saved one.
    if (value == s) out = {s, "as saved in the checkpoint being resumed", false};
    if (value != "auto") return;
    value = s;
    out = {s, "kept from the checkpoint being resumed", true};
  };
  keep(cfg.amp.precision, "amp.precision", kept_from_save.precision);
  keep(cfg.train.channels_last, "train.channels_last", kept_from_save.channels_last);
}

}  // namespace

nlohmann::json to_json(const AutoSettings& s) {
  return {{"precision", choice_json(s.precision)}, {"channels_last", choice_json(s.channels_last)}};
}

AutoSettings agree_auto_settings(TrainConfig& cfg, const c10::Device& device, comm::World& world,
                                 const std::string& saved_config_json) {
  const std::string decided = decided_by_rank0(world, "cohort/auto_settings", [&] {
    TrainConfig mine = cfg;
    AutoSettings from_save;
    keep_saved_choices(mine, saved_config_json, from_save);
    Hardware hw = probe_hardware(device);
    // Only a precision still to be chosen pays for the measurement (an explicit or resumed one does not).
    if (mine.amp.precision == "auto") measure_cpu_bf16_against_fp32(hw);
    AutoSettings s = resolve_auto(mine, hw);
    if (!from_save.precision.value.empty()) s.precision = from_save.precision;
    if (!from_save.channels_last.value.empty()) s.channels_last = from_save.channels_last;
    return to_json(s).dump();
  });
  const auto j = nlohmann::json::parse(decided);
  AutoSettings s{choice_from(j.at("precision")), choice_from(j.at("channels_last"))};
  cfg.amp.precision = s.precision.value;
  cfg.train.channels_last = s.channels_last.value;
  return s;
}

std::string describe(const AutoSettings& s) {
  auto one = [](const std::string& what, const AutoChoice& c) {
    return what + " (" + (c.automatic ? "auto: " + c.why : c.why) + ")";
  };
  return one("precision " + s.precision.value, s.precision) + ", " +
         one(s.channels_last.value == "true" ? "channels-last" : "contiguous layout", s.channels_last);
}

bool channels_last(const TrainConfig& cfg) {
  COHORT_ASSERT(cfg.train.channels_last != "auto", "train.channels_last resolved (resolve_auto) before use");
  return cfg.train.channels_last == "true";
}

}  // namespace cohort::train

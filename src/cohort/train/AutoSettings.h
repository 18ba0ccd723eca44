// What `auto` means for amp.precision and train.channels_last: the precision and memory layout this
// hardware runs fastest without giving up accuracy. Users of PyTorch and Lightning have to know to ask
// for bf16-mixed and channels_last; cohort asks the hardware, says what it picked, and keeps the choice
// in config.json and every checkpoint, so a resumed run trains in the precision it started with.
//
//   auto hw = cohort::train::probe_hardware(device);              // CPU flags, the GPU's capability
//   cohort::train::measure_cpu_bf16_against_fp32(hw);              // native bf16: is it faster here?
//   const auto chosen = cohort::train::resolve_auto(cfg, hw);      // explicit values are kept
//   std::cout << cohort::train::describe(chosen);                  // "precision bf16 (auto: ...)"
//   if (cohort::train::channels_last(cfg)) to_channels_last(*model);
//
// Note [What auto picks]
// - Precision on CPU: bf16 autocast where the processor multiplies bf16 natively (AVX512-BF16, which
//   every AMX-BF16 processor also has, or Arm's BF16), else fp32: without those units oneDNN emulates
//   bf16 and it is slower than fp32. The kernel's CPU flags say which units there are;
//   COHORT_CPU_BF16=0 masks them (=1 claims them, and skips the measurement below), for tests and for
//   comparing.
// - Native units are not enough: bf16 is chosen only where its measured peak (log/Peak.h: a large matmul
//   and convolution at the worker's threads, cached per machine in peaks.json) is at least
//   kCpuBf16MinSpeedup times fp32's. On an Intel Xeon with AVX512-BF16 and no AMX enabled (2026-12-02),
//   oneDNN 2.6's bf16 reached 82 GFLOP/s a core and its fp32 132, and the default job ran at 502 to 520
//   images/s in bf16 against 599 to 642 in fp32 (docs/default-job.md); on the AMD EPYC with AVX512-BF16, bf16
//   reached 428 to 494 GFLOP/s and the job ran 2.2x its fp32 speed.
// - Precision on CUDA: bf16 from compute capability 8.0 (Ampere) on; before that fp16-master (fp16
//   weights, fp32 batch norm and master weights, dynamic loss scaling), or fp16 autocast where the run
//   averages its own weights (train.lookahead) or compresses its gradients (dist.compress), which
//   expect fp32 gradients; fp32 where the optimizer steps inside backward (optim.in_backward), which
//   cannot use loss scaling.
// - What stays fp32 whatever the precision: weights, gradients and optimizer state (except under
//   fp16-master, whose masters are fp32), the loss and its softmax (from fp32 logits), batch-norm
//   statistics, airbench's whitening eigendecomposition, the EMA/lookahead average and evaluation
//   metrics. See Note [The mixed-precision dtype contract] in amp/MixedPrecision.h.
// - Layout: channels-last for convolutional models (the small ResNets, torchvision's ResNets, airbench)
//   on CPU (oneDNN's NHWC kernels) and on GPUs with tensor cores (7.0 on); contiguous for the ViT and
//   the MLP, whose convolution, if any, is one patch embedding, and for fp32 on an x86 CPU without
//   AVX-512 (Note [Channels-last on a CPU without AVX-512] in AutoSettings.cpp).
// - Every rank uses rank 0's choice, so machines with different processors still train alike.
//   `cohort eval` (fp32) resolves only the layout, on each rank: a layout changes no numbers beyond rounding.
#pragma once

#include <optional>
#include <string>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "cohort/comm/Rendezvous.h"
#include "cohort/config/Config.h"

namespace cohort::train {

// What the decision depends on, probed once per run (or written by hand in a test).
struct Hardware {
  bool cuda = false;
  int cuda_major = 0, cuda_minor = 0;  // compute capability of the training GPU
  std::string cuda_name;
  bool cpu_bf16 = false;        // the CPU has native bf16 dot products
  std::string cpu_bf16_source;  // what said so, for the log
  // The worker's measured bf16 and fp32 peaks in FLOP/s (log::cpu_peak); 0 where not measured (a GPU, no
  // native bf16, COHORT_CPU_BF16 set, or a test), and then the flags alone decide.
  double cpu_bf16_flops = 0, cpu_fp32_flops = 0;
  // The CPU has oneDNN's wide convolution kernels: AVX-512 on x86 (avx512f), or it is not x86 (Arm).
  bool cpu_wide_vectors = true;
};

// Reads the CPU's features (the kernel's flags, then COHORT_CPU_BF16) and, on CUDA, the device's capability.
Hardware probe_hardware(const c10::Device& device);
// Only the CPU part, from a file in /proc/cpuinfo's format.
Hardware probe_cpu(const std::string& cpuinfo_path = "/proc/cpuinfo");
// COHORT_CPU_BF16 when it is "0" (mask the units) or "1" (claim them); any other value is ignored.
std::optional<std::string> cpu_bf16_override();
// Fills hw's bf16 and fp32 peaks where a CPU's flags show native bf16 and COHORT_CPU_BF16 does not
// override them: log::cpu_peak at this process's threads, about a second each the first time on a
// machine, then read from peaks.json. agree_auto_settings calls it only while amp.precision is auto.
void measure_cpu_bf16_against_fp32(Hardware& hw);

// bf16 on a CPU must measure at least this much faster than fp32 (Note [What auto picks]): its
// autocast adds casts, and the memory-bound layers gain less than the peak does.
constexpr double kCpuBf16MinSpeedup = 1.25;

struct AutoChoice {
  std::string value;  // "bf16", "fp32", ...; "true"/"false" for the layout
  std::string why;
  bool automatic = false;  // chosen here, not set by the user
};

// The pure decisions of Note [What auto picks]. `why_not_fp16_master` says why the run cannot use
// fp16-master on a GPU without bf16 (empty: it can); see fp16_master_unsuitable().
AutoChoice choose_precision(const Hardware& hw, const std::string& why_not_fp16_master);
// `precision`: the run's, resolved (choose_precision's value or the explicit one).
AutoChoice choose_channels_last(const Hardware& hw, const std::string& model_name, const std::string& precision);
// Why fp16 weights and gradients do not fit this config ("" when they do): train.lookahead averages the
// weights themselves, and gradient compression (dist.compress) expects fp32 gradients.
std::string fp16_master_unsuitable(const TrainConfig& cfg);

struct AutoSettings {
  AutoChoice precision;
  AutoChoice channels_last;
};

// Replaces "auto" in cfg.amp.precision and cfg.train.channels_last with the choices; explicit values are
// kept and reported as such.
AutoSettings resolve_auto(TrainConfig& cfg, const Hardware& hw);
// The run's settings, the same on every rank: rank 0 probes its hardware and resolves cfg; a resumed run
// whose checkpoint config (`saved_config_json`, empty when not resuming) holds a resolved value keeps it
// where cfg still says auto. Every rank's cfg then holds rank 0's values.
AutoSettings agree_auto_settings(TrainConfig& cfg, const c10::Device& device, comm::World& world,
                                 const std::string& saved_config_json);

// {"precision": {"value", "why", "auto"}, "channels_last": {...}}: summary.json's "auto", and how rank 0's
// choice travels to the other ranks.
nlohmann::json to_json(const AutoSettings& s);

// For the run's first line: "bf16 (auto: the CPU has AVX512-BF16), channels-last (auto: ...)".
std::string describe(const AutoSettings& s);

// train.channels_last after resolve_auto; an unresolved "auto" is an internal error.
bool channels_last(const TrainConfig& cfg);

}  // namespace cohort::train

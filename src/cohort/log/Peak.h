// What a device can do at most, in FLOP/s, so a run can say how close it came (MFU: achieved FLOP/s over
// the peak; summary.json's mfu). GPUs: NVIDIA's published dense peaks per compute dtype, by device name.
// CPUs have no such table (the same model name runs at different clocks and with different units
// enabled), so the peak is measured: a large matmul and a large convolution in the run's dtype and
// thread count, through the same ATen and oneDNN paths training uses, the faster of the two; cached
// per machine. Note [Which peak] in Peak.cpp.
//
//   auto p = cohort::log::gpu_peak("NVIDIA H100 80GB HBM3", "bfloat16");   // 989.4e12, datasheet
//   auto c = cohort::log::cpu_peak("bfloat16", at::get_num_threads(), cohort::log::peak_cache_file());
//   double mfu = achieved_flops_per_second / (c.flops * world_size);
#pragma once

#include <filesystem>
#include <optional>
#include <set>
#include <string>

#include <c10/core/Device.h>

namespace cohort::log {

struct Peak {
  double flops = 0;    // FLOP/s of one device (one GPU, or one worker's CPU threads)
  std::string source;  // where the figure comes from, for the summary
};

// compute_dtype: "float32", "bfloat16" or "float16" (amp::MixedPrecision::compute_dtype). Nothing for a
// device or dtype the table does not hold.
std::optional<Peak> gpu_peak(const std::string& device_name, const std::string& compute_dtype);

// Measured once per CPU model, dtype and thread count, then read from `cache` (JSON).
Peak cpu_peak(const std::string& compute_dtype, int threads, const std::filesystem::path& cache);

// The peak of one worker training on `device` in compute_dtype: the table's for a GPU, measured (or
// cached) at this process's thread count for a CPU. Nothing for a GPU the table does not hold, with the
// reason in *why. The summary and the training windows both divide by it.
std::optional<Peak> device_peak(const c10::Device& device, const std::string& compute_dtype,
                                std::string* why = nullptr);

// peaks.json in util::cache_dir(): $COHORT_CACHE/peaks.json, or ~/.cache/cohort/peaks.json.
std::filesystem::path peak_cache_file();

// "model name" of /proc/cpuinfo ("unknown CPU" when it has none).
std::string cpu_model(const std::string& cpuinfo_path = "/proc/cpuinfo");

// The processor's feature flags as the kernel reports them (the "flags" line on x86, "Features" on Arm).
std::set<std::string> kernel_cpu_flags(const std::string& cpuinfo_path = "/proc/cpuinfo");

// What a CPU's peak is cached under: its model name and the vector units oneDNN picks kernels by
// ("AMD EPYC [avx2 avx512f avx512_bf16]"). One model name covers CPUs with and without AVX-512 (seen:
// "AMD EPYC" on both), and their peaks differ several times over.
std::string cpu_identity(const std::string& cpuinfo_path = "/proc/cpuinfo");

// The name CUDA gives device `index` ("" without CUDA).
std::string cuda_device_name(int index);

}  // namespace cohort::log

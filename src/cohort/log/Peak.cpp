#include "cohort/log/Peak.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <sstream>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "cohort/util/AtomicFile.h"
#include "cohort/util/CacheDir.h"

#ifdef COHORT_HAVE_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

// Note [Which peak]
// MFU is only as honest as its denominator. For NVIDIA GPUs we divide by the dense (not 2:4-sparse)
// tensor-core peak of the run's compute dtype from NVIDIA's datasheets, as PaLM's MFU, torchtitan and
// Lightning's ThroughputMonitor do; float32 takes the non-tensor-core figure, since cohort leaves TF32 off.
// For CPUs no datasheet figure is reachable: clocks, core counts per worker and enabled units (AMX,
// AVX512-BF16) differ between machines of one name. So we measure what the run's own kernels reach: a
// 1024^3 matmul and a 64-channel 3x3 convolution (batch 8 at 56x56, channels-last and contiguous), in
// the run's dtype with the worker's threads, best of 3 after a warm-up, the fastest. That is a ceiling
// the model's large operands can approach; small ones cannot, which is what MFU shows. Cached per CPU
// model and vector units (cpu_identity), dtype and thread count in peaks.json, so the cost (about a
// second) is paid once per machine. Keyed by the model name alone, an AVX2-only "AMD EPYC" read the
// AVX-512 one's figure and the default job showed an MFU of 195% (2026-11-28); and measured in
// channels-last alone, the convolution there reached 12 GFLOP/s where the contiguous one reaches 36.

namespace cohort::log {

namespace fs = std::filesystem;

namespace {

struct Row {
  const char* name;         // a substring of CUDA's device name; the first row that matches wins
  double fp32, bf16, fp16;  // dense TFLOP/s; 0: no such unit
  const char* source;
};

// NVIDIA datasheets, dense figures (the sparse ones are twice these).
constexpr Row kGpus[] = {
    {"H200", 67, 989.4, 989.4, "NVIDIA H200 Tensor Core GPU datasheet (SXM), dense"},
    {"H100 PCIe", 51, 756.5, 756.5, "NVIDIA H100 Tensor Core GPU datasheet (PCIe), dense"},
    {"H100 NVL", 60, 835.5, 835.5, "NVIDIA H100 Tensor Core GPU datasheet (NVL), dense"},
    {"H100", 67, 989.4, 989.4, "NVIDIA H100 Tensor Core GPU datasheet (SXM), dense"},
    {"A100", 19.5, 312, 312, "NVIDIA A100 Tensor Core GPU datasheet, dense"},
    {"L40S", 91.6, 362.05, 362.05, "NVIDIA L40S datasheet, dense"},
    {"L40", 90.5, 181.05, 181.05, "NVIDIA L40 datasheet, dense"},
    {"A10", 31.2, 125, 125, "NVIDIA A10 datasheet, dense"},
    {"L4", 30.3, 121, 121, "NVIDIA L4 datasheet, dense"},
    {"T4", 8.1, 0, 65, "NVIDIA T4 datasheet (no bfloat16 tensor cores), dense"},
};

at::ScalarType dtype_of(const std::string& compute_dtype) {
  if (compute_dtype == "bfloat16") return at::kBFloat16;
  if (compute_dtype == "float16") return at::kHalf;
  return at::kFloat;
}

// Best of 3 after a warm-up, in FLOP/s.
double measure(double flops, const std::function<void()>& run) {
  run();
  double best = 0;
  for (int i = 0; i < 3; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    run();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, flops / std::max(s, 1e-9));
  }
  return best;
}

Peak measure_cpu(const std::string& compute_dtype, int threads) {
  const auto dtype = dtype_of(compute_dtype);
  const at::NoGradGuard no_grad;
  const int64_t n = 1024;
  const auto a = at::randn({n, n}).to(dtype), b = at::randn({n, n}).to(dtype);
  const double matmul = measure(2.0 * n * n * n, [&] { at::mm(a, b); });
  // Both layouts, the faster counting: oneDNN's channels-last kernels are its AVX-512 ones, and on a CPU
  // without AVX-512 the contiguous layout is the fast one (Note [Channels-last on a CPU without AVX-512]).
  const int64_t batch = 8, ch = 64, hw = 56;
  double conv = 0;
  std::string layout;
  for (const auto format : {at::MemoryFormat::ChannelsLast, at::MemoryFormat::Contiguous}) {
    const auto x = at::randn({batch, ch, hw, hw}).to(dtype).contiguous(format);
    const auto w = at::randn({ch, ch, 3, 3}).to(dtype).contiguous(format);
    const double reached = measure(2.0 * batch * ch * hw * hw * ch * 9, [&] { at::conv2d(x, w, {}, 1, 1); });
    if (reached > conv)
      conv = reached, layout = format == at::MemoryFormat::ChannelsLast ? "channels-last" : "contiguous";
  }
  return {std::max(matmul, conv),
          "measured here: " + std::to_string(n) + "^3 matmul " + std::to_string(static_cast<int64_t>(matmul / 1e9)) +
              " GFLOP/s, 64-channel 3x3 convolution " + std::to_string(static_cast<int64_t>(conv / 1e9)) +
              " GFLOP/s (" + layout + "), " + compute_dtype + ", " + std::to_string(threads) + " thread(s)"};
}

}  // namespace

std::optional<Peak> gpu_peak(const std::string& device_name, const std::string& compute_dtype) {
  for (const auto& row : kGpus) {
    if (device_name.find(row.name) == std::string::npos) continue;
    const double tflops = compute_dtype == "bfloat16" ? row.bf16 : compute_dtype == "float16" ? row.fp16 : row.fp32;
    if (tflops <= 0) return std::nullopt;
    return Peak{tflops * 1e12, std::string(row.source) + ", " + compute_dtype};
  }
  return std::nullopt;
}

Peak cpu_peak(const std::string& compute_dtype, int threads, const fs::path& cache) {
  const std::string key = cpu_identity() + " | " + compute_dtype + " | " + std::to_string(threads) + " thread(s)";
  nlohmann::json known = nlohmann::json::object();
  if (std::ifstream in(cache); in) {
    known = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (!known.is_object()) known = nlohmann::json::object();
  }
  if (known.contains(key) && known[key].value("flops", 0.0) > 0)
    return {known[key]["flops"].get<double>(), known[key].value("source", "") + " (cached in " + cache.string() + ")"};
  Peak p = measure_cpu(compute_dtype, threads);
  known[key] = {{"flops", p.flops}, {"source", p.source}};
  try {
    fs::create_directories(cache.parent_path());
    util::write_file_atomic(cache, known.dump(2) + "\n");
  } catch (const std::exception& e) {
    std::cerr << "cohort: note: the measured CPU peak is not cached: " << e.what() << std::endl;
  }
  return p;
}

std::optional<Peak> device_peak(const c10::Device& device, const std::string& compute_dtype, std::string* why) {
  if (!device.is_cuda()) return cpu_peak(compute_dtype, at::get_num_threads(), peak_cache_file());
  const std::string name = cuda_device_name(device.index());
  auto peak = gpu_peak(name, compute_dtype);
  if (!peak && why) *why = "no peak known for " + name + " in " + compute_dtype + " (log/Peak.cpp's table)";
  return peak;
}

fs::path peak_cache_file() { return util::cache_dir() / "peaks.json"; }

std::string cpu_model(const std::string& cpuinfo_path) {
  std::ifstream in(cpuinfo_path);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon != std::string::npos) return line.substr(line.find_first_not_of(" \t", colon + 1));
  }
  return "unknown CPU";
}

// Why not a library: Debian 12's libcpuinfo snapshot (2022) predates AMX detection, and pip's LibTorch
// carries its own copy of cpuinfo whose globals a second copy in the same process could shadow. The
// kernel lists a feature only when it also saves that register state, which is what matters here.
std::set<std::string> kernel_cpu_flags(const std::string& cpuinfo_path) {
  std::ifstream in(cpuinfo_path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0 && line.rfind("Features", 0) != 0) continue;
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::istringstream words(line.substr(colon + 1));
    std::set<std::string> flags;
    for (std::string w; words >> w;) flags.insert(w);
    return flags;  // the first processor's; they agree
  }
  return {};
}

std::string cpu_identity(const std::string& cpuinfo_path) {
  const auto flags = kernel_cpu_flags(cpuinfo_path);
  std::string units;
  for (const char* unit : {"avx2", "avx512f", "avx512_bf16", "amx_bf16", "asimd", "sve", "bf16"})
    if (flags.count(unit)) units += (units.empty() ? "" : " ") + std::string(unit);
  return cpu_model(cpuinfo_path) + " [" + units + "]";
}

std::string cuda_device_name(int index) {
#ifdef COHORT_HAVE_CUDA
  return at::cuda::getDeviceProperties(index)->name;
#else
  (void)index;
  return "";
#endif
}

}  // namespace cohort::log

// The peaks MFU divides by (log/Peak.h): the GPU table by CUDA's device names, and the CPU measurement,
// made once and then read from its cache.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <unistd.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "cohort/log/Peak.h"

namespace fs = std::filesystem;
using cohort::log::gpu_peak;

TEST(Peak, GpusAreFoundByTheNamesCudaGivesThem) {
  EXPECT_DOUBLE_EQ(gpu_peak("NVIDIA H100 80GB HBM3", "bfloat16")->flops, 989.4e12);
  EXPECT_DOUBLE_EQ(gpu_peak("NVIDIA H100 PCIe", "float16")->flops, 756.5e12) << "not the SXM figure";
  EXPECT_DOUBLE_EQ(gpu_peak("NVIDIA H200", "bfloat16")->flops, 989.4e12);
  EXPECT_DOUBLE_EQ(gpu_peak("NVIDIA A100-SXM4-80GB", "float32")->flops, 19.5e12);
  EXPECT_DOUBLE_EQ(gpu_peak("NVIDIA L40", "bfloat16")->flops, 181.05e12) << "not the L40S or L4 row";
  EXPECT_DOUBLE_EQ(gpu_peak("NVIDIA A10", "bfloat16")->flops, 125e12) << "not the A100 row";
  EXPECT_FALSE(gpu_peak("Tesla T4", "bfloat16")) << "T4 has no bfloat16 tensor cores";
  EXPECT_FALSE(gpu_peak("NVIDIA GeForce RTX 4090", "bfloat16")) << "not in the table: no MFU rather than a guess";
  EXPECT_NE(gpu_peak("NVIDIA H200", "bfloat16")->source.find("datasheet"), std::string::npos);
}

TEST(Peak, ACpuIsMeasuredOnceAndThenReadFromTheCache) {
  const fs::path dir = fs::temp_directory_path() / ("cohort_peak_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const fs::path cache = dir / "peaks.json";
  const auto first = cohort::log::cpu_peak("float32", at::get_num_threads(), cache);
  EXPECT_GT(first.flops, 0);
  EXPECT_NE(first.source.find("measured here"), std::string::npos) << first.source;
  // Both layouts are measured and the faster one named (channels-last is oneDNN's AVX-512 path only).
  EXPECT_TRUE(first.source.find("(channels-last)") != std::string::npos ||
              first.source.find("(contiguous)") != std::string::npos)
      << first.source;
  ASSERT_TRUE(fs::exists(cache));
  const auto second = cohort::log::cpu_peak("float32", at::get_num_threads(), cache);
  EXPECT_EQ(second.flops, first.flops);
  EXPECT_NE(second.source.find("cached in"), std::string::npos) << second.source;
  fs::remove_all(dir);
}

TEST(Peak, TheCpuModelComesFromCpuinfo) {
  const fs::path file = fs::temp_directory_path() / ("cohort_cpuinfo_" + std::to_string(::getpid()));
  std::ofstream(file) << "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\nflags\t: fpu\n";
  EXPECT_EQ(cohort::log::cpu_model(file.string()), "Intel(R) Xeon(R) Platinum 8480+");
  std::ofstream(file) << "processor\t: 0\n";
  EXPECT_EQ(cohort::log::cpu_model(file.string()), "unknown CPU");
  fs::remove(file);
}

// Debian's LibTorch does fp32 matrix products in the system BLAS; scripts/install-deps puts OpenBLAS
// there, without which they run in the reference libblas3 (ViT-B/32's CPU step 8 times slower). pip's
// LibTorch brings MKL and maps no system BLAS.
TEST(Peak, MatrixProductsDoNotRunInTheReferenceBlas) {
  (void)at::mm(at::ones({4, 4}), at::ones({4, 4}));
  std::ifstream maps("/proc/self/maps");
  std::string reference;
  for (std::string line; reference.empty() && std::getline(maps, line);)
    if (line.find("/blas/libblas.so") != std::string::npos) reference = line.substr(line.find('/'));
  EXPECT_EQ(reference, "") << "the reference BLAS is loaded (scripts/install-deps installs libopenblas0-openmp)";
}

// One model name, two machines: an AVX2-only EPYC and one with AVX512-BF16 get peaks of their own.
TEST(Peak, TheCacheKeyNamesTheVectorUnitsBesideTheModel) {
  const fs::path file = fs::temp_directory_path() / ("cohort_cpuinfo_units_" + std::to_string(::getpid()));
  std::ofstream(file) << "model name\t: AMD EPYC\nflags\t: fpu sse2 avx avx2 fma\n";
  EXPECT_EQ(cohort::log::cpu_identity(file.string()), "AMD EPYC [avx2]");
  std::ofstream(file) << "model name\t: AMD EPYC\nflags\t: fpu sse2 avx2 avx512f avx512bw avx512_bf16\n";
  EXPECT_EQ(cohort::log::cpu_identity(file.string()), "AMD EPYC [avx2 avx512f avx512_bf16]");
  fs::remove(file);
}

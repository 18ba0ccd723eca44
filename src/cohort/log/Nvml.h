// GPU utilization and memory through NVML, loaded at run time: the binary starts, and reports no GPU,
// on machines without the NVIDIA driver. This is what the seed runs collected with `nvidia-smi` dumps.
//
//   cohort::log::Nvml nvml;                  // dlopen("libnvidia-ml.so.1"); never throws
//   if (nvml.available())
//     if (auto s = nvml.sample(0)) std::cout << s->util_percent << "% " << s->memory_used << " bytes\n";
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace cohort::log {

struct GpuSample {
  int index = 0;
  double util_percent = 0;  // of the last sample period, as nvidia-smi shows it
  int64_t memory_used = 0;  // bytes, all processes on the device
  int64_t memory_total = 0;
};

class Nvml {
 public:
  Nvml();
  ~Nvml();
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  bool available() const { return device_count_ > 0; }
  int device_count() const { return device_count_; }
  // Why NVML is absent ("libnvidia-ml.so.1 not found", "nvmlInit failed: 9"), for the log.
  const std::string& why_unavailable() const { return why_; }
  std::optional<GpuSample> sample(int index) const;

 private:
  void* lib_ = nullptr;
  bool initialized_ = false;
  int device_count_ = 0;
  std::string why_;
  struct Api;
  Api* api_ = nullptr;
};

}  // namespace cohort::log

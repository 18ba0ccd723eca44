#include "cohort/log/Nvml.h"

#include <dlfcn.h>

namespace cohort::log {

// The few NVML declarations we call, with the C ABI of nvml.h (types stay opaque or plain structs, so
// no CUDA headers are needed to build). The _v2 entry points are the ones current drivers export.
namespace {
using nvmlReturn_t = int;
using nvmlDevice_t = struct nvmlDevice_st*;
struct nvmlUtilization_t {
  unsigned int gpu;
  unsigned int memory;
};
struct nvmlMemory_t {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};
}  // namespace

struct Nvml::Api {
  nvmlReturn_t (*init)() = nullptr;
  nvmlReturn_t (*shutdown)() = nullptr;
  nvmlReturn_t (*count)(unsigned int*) = nullptr;
  nvmlReturn_t (*handle)(unsigned int, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*utilization)(nvmlDevice_t, nvmlUtilization_t*) = nullptr;
  nvmlReturn_t (*memory)(nvmlDevice_t, nvmlMemory_t*) = nullptr;
};

namespace {
template <class F>
bool bind(void* lib, const char* name, F& f) {
  f = reinterpret_cast<F>(dlsym(lib, name));
  return f != nullptr;
}
}  // namespace

Nvml::Nvml() {
  lib_ = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib_) {
    why_ = "libnvidia-ml.so.1 not found (no NVIDIA driver)";
    return;
  }
  api_ = new Api;
  if (!bind(lib_, "nvmlInit_v2", api_->init) || !bind(lib_, "nvmlShutdown", api_->shutdown) ||
      !bind(lib_, "nvmlDeviceGetCount_v2", api_->count) || !bind(lib_, "nvmlDeviceGetHandleByIndex_v2", api_->handle) ||
      !bind(lib_, "nvmlDeviceGetUtilizationRates", api_->utilization) ||
      !bind(lib_, "nvmlDeviceGetMemoryInfo", api_->memory)) {
    why_ = "libnvidia-ml.so.1 lacks an NVML entry point cohort needs";
    return;
  }
  if (const int rc = api_->init(); rc != 0) {
    why_ = "nvmlInit failed with NVML error " + std::to_string(rc);
    return;
  }
  initialized_ = true;
  unsigned int n = 0;
  if (api_->count(&n) != 0 || n == 0) {
    why_ = "NVML reports no GPU";
    return;
  }
  device_count_ = static_cast<int>(n);
}

Nvml::~Nvml() {
  if (initialized_) api_->shutdown();
  delete api_;
  if (lib_) dlclose(lib_);
}

std::optional<GpuSample> Nvml::sample(int index) const {
  if (index < 0 || index >= device_count_) return std::nullopt;
  nvmlDevice_t dev = nullptr;
  if (api_->handle(static_cast<unsigned int>(index), &dev) != 0) return std::nullopt;
  GpuSample s;
  s.index = index;
  nvmlUtilization_t u{};
  if (api_->utilization(dev, &u) == 0) s.util_percent = u.gpu;
  nvmlMemory_t m{};
  if (api_->memory(dev, &m) == 0) {
    s.memory_used = static_cast<int64_t>(m.used);
    s.memory_total = static_cast<int64_t>(m.total);
  }
  return s;
}

}  // namespace cohort::log

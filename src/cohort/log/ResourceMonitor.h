// A thread per rank that samples what the process uses (resident memory, CPU) and, where NVML is
// present, its GPU's utilization and memory, every `log.monitor_s` seconds. Each sample is appended to
// the rank's `resources.rank<R>.jsonl`; the trainer gathers the latest samples of all ranks at each
// log interval for metrics.jsonl and TensorBoard, and the totals for summary.json.
//
//   cohort::log::ResourceMonitor mon(2.0, run_dir / "resources.rank0.jsonl", /*gpu_index=*/-1);
//   ... train ...
//   auto now = mon.sample_now();           // on demand, any thread
//   auto totals = mon.totals();            // peak RSS, mean CPU, GPU means and peaks so far
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <thread>

#include "cohort/log/Nvml.h"

namespace cohort::log {

struct ResourceSample {
  double elapsed_s = 0;    // since the monitor started
  int64_t rss = 0;         // bytes
  int64_t peak_rss = 0;    // bytes, VmHWM
  double cpu_percent = 0;  // user + system time over wall time since the previous sample; 100 = one core
  std::optional<GpuSample> gpu;
};

struct ResourceTotals {
  int64_t samples = 0;
  int64_t peak_rss = 0;
  double mean_cpu_percent = 0;
  bool has_gpu = false;
  double mean_gpu_util_percent = 0;
  double max_gpu_util_percent = 0;
  int64_t peak_gpu_memory_used = 0;
  int64_t gpu_memory_total = 0;
};

class ResourceMonitor {
 public:
  // interval_s == 0: no thread; sample_now() still works. gpu_index: the local rank, whose GPU (modulo
  // the device count) is sampled where NVML is present; < 0: no GPU sampling.
  ResourceMonitor(double interval_s, const std::filesystem::path& jsonl, int gpu_index);
  ~ResourceMonitor();
  ResourceMonitor(const ResourceMonitor&) = delete;
  ResourceMonitor& operator=(const ResourceMonitor&) = delete;

  // Samples now; `record` appends it to the file and the totals (false: a look that changes nothing,
  // for the trainer's gathers, so the file keeps its regular period).
  ResourceSample sample_now(bool record = true);
  ResourceTotals totals() const;
  // Ends the sampling thread (the destructor does too); sample_now() and totals() still work.
  void stop();
  bool gpu_available() const { return gpu_index_ >= 0 && nvml_.available(); }
  const Nvml& nvml() const { return nvml_; }

 private:
  void loop(double interval_s);
  void record(const ResourceSample& s);

  using Clock = std::chrono::steady_clock;
  Nvml nvml_;
  int gpu_index_;
  Clock::time_point start_;
  mutable std::mutex mu_;  // guards everything below and the file
  Clock::time_point last_time_;
  double last_cpu_s_ = 0;
  ResourceTotals totals_;
  double cpu_sum_ = 0, gpu_sum_ = 0;
  std::ofstream out_;
  bool stop_ = false;
  std::condition_variable wake_;
  std::thread thread_;
};

// Seconds of CPU (user + system) this process has used, from getrusage.
double process_cpu_seconds();

}  // namespace cohort::log

#include "cohort/log/ResourceMonitor.h"

#include <sys/resource.h>

#include <algorithm>

#include <nlohmann/json.hpp>

#include "cohort/util/Memory.h"

namespace cohort::log {

double process_cpu_seconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  auto sec = [](const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec * 1e-6; };
  return sec(ru.ru_utime) + sec(ru.ru_stime);
}

ResourceMonitor::ResourceMonitor(double interval_s, const std::filesystem::path& jsonl, int gpu_index)
    : gpu_index_(gpu_index >= 0 && nvml_.available() ? gpu_index % nvml_.device_count() : -1),
      start_(Clock::now()),
      last_time_(start_),
      last_cpu_s_(process_cpu_seconds()) {
  if (!jsonl.empty()) out_.open(jsonl, std::ios::app);
  if (interval_s > 0) thread_ = std::thread([this, interval_s] { loop(interval_s); });
}

ResourceMonitor::~ResourceMonitor() { stop(); }

void ResourceMonitor::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void ResourceMonitor::loop(double interval_s) {
  const auto period = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(interval_s));
  auto next = Clock::now() + period;
  std::unique_lock<std::mutex> lock(mu_);
  while (!wake_.wait_until(lock, next, [this] { return stop_; })) {
    lock.unlock();
    sample_now();
    lock.lock();
    next += period;
  }
}

ResourceSample ResourceMonitor::sample_now(bool record_it) {
  ResourceSample s;
  s.rss = util::current_rss_bytes();
  s.peak_rss = util::peak_rss_bytes();
  if (gpu_available()) s.gpu = nvml_.sample(gpu_index_);
  const auto now = Clock::now();
  const double cpu = process_cpu_seconds();
  std::lock_guard<std::mutex> lock(mu_);
  s.elapsed_s = std::chrono::duration<double>(now - start_).count();
  const double wall = std::chrono::duration<double>(now - last_time_).count();
  // Two samples close together say nothing about CPU use; keep the previous reference then.
  if (wall >= 0.05) {
    s.cpu_percent = 100.0 * (cpu - last_cpu_s_) / wall;
    if (record_it) {
      last_time_ = now;
      last_cpu_s_ = cpu;
    }
  } else {
    s.cpu_percent = totals_.samples > 0 ? cpu_sum_ / totals_.samples : 0;
  }
  if (record_it) record(s);
  return s;
}

void ResourceMonitor::record(const ResourceSample& s) {
  totals_.samples += 1;
  totals_.peak_rss = std::max(totals_.peak_rss, s.peak_rss);
  cpu_sum_ += s.cpu_percent;
  totals_.mean_cpu_percent = cpu_sum_ / totals_.samples;
  nlohmann::json j = {{"elapsed_s", s.elapsed_s},
                      {"time", std::time(nullptr)},
                      {"rss_bytes", s.rss},
                      {"peak_rss_bytes", s.peak_rss},
                      {"cpu_percent", s.cpu_percent}};
  if (s.gpu) {
    totals_.has_gpu = true;
    gpu_sum_ += s.gpu->util_percent;
    totals_.mean_gpu_util_percent = gpu_sum_ / totals_.samples;
    totals_.max_gpu_util_percent = std::max(totals_.max_gpu_util_percent, s.gpu->util_percent);
    totals_.peak_gpu_memory_used = std::max(totals_.peak_gpu_memory_used, s.gpu->memory_used);
    totals_.gpu_memory_total = s.gpu->memory_total;
    j["gpu"] = {{"index", s.gpu->index},
                {"util_percent", s.gpu->util_percent},
                {"memory_used_bytes", s.gpu->memory_used},
                {"memory_total_bytes", s.gpu->memory_total}};
  }
  if (out_.is_open()) out_ << j.dump() << "\n" << std::flush;
}

ResourceTotals ResourceMonitor::totals() const {
  std::lock_guard<std::mutex> lock(mu_);
  return totals_;
}

}  // namespace cohort::log

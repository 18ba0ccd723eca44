#include "cohort/record/RunSummary.h"

#include <ctime>
#include <iomanip>
#include <iostream>

#include "cohort/log/Peak.h"
#include "cohort/util/AtomicFile.h"
#include "cohort/util/Memory.h"
#include "cohort/util/StopSignal.h"

namespace cohort::record {

namespace {

// Every rank's figures, gathered so rank 0 can report each rank.
struct Gathered {
  static constexpr int kTotals = 7;
  std::vector<double> totals;  // kTotals per rank: see gather()
  std::vector<int64_t> state;  // params, grads, optimizer bytes per rank
  int64_t bad_files = 0;       // the run's: a file met by two ranks counts twice
};

Gathered gather(const RunFacts& f, log::ResourceMonitor& monitor) {
  const int world = f.info.world_size;
  monitor.sample_now();  // so a run shorter than log.monitor_s still has one sample
  const auto tot = monitor.totals();
  auto mine = at::tensor(
      {double(util::peak_rss_bytes()), tot.mean_cpu_percent, tot.has_gpu ? 1.0 : 0.0, tot.mean_gpu_util_percent,
       tot.max_gpu_util_percent, double(tot.peak_gpu_memory_used), double(tot.gpu_memory_total)},
      at::kDouble);
  auto all_tot = at::zeros({world * Gathered::kTotals}, at::kDouble);
  f.comm.all_gather(all_tot, mine, "resource totals")->wait();
  const auto& sb = f.state_bytes;
  auto all_state = at::zeros({world * 3}, at::kLong);
  f.comm.all_gather(all_state, at::tensor({sb.params, sb.grads, sb.optimizer}, at::kLong), "model-state bytes")->wait();
  auto all_bad = at::zeros({world}, at::kLong);
  f.comm.all_gather(all_bad, at::full({1}, f.bad_files, at::kLong), "bad file counts")->wait();
  Gathered g;
  g.totals.assign(all_tot.data_ptr<double>(), all_tot.data_ptr<double>() + all_tot.numel());
  g.state.assign(all_state.data_ptr<int64_t>(), all_state.data_ptr<int64_t>() + all_state.numel());
  g.bad_files = all_bad.sum().item<int64_t>();
  return g;
}

nlohmann::json per_rank_resources(const Gathered& g, int world) {
  nlohmann::json resources = nlohmann::json::array();
  for (int r = 0; r < world; ++r) {
    const double* f = g.totals.data() + r * Gathered::kTotals;
    nlohmann::json one = {{"rank", r}, {"peak_rss_bytes", static_cast<int64_t>(f[0])}, {"mean_cpu_percent", f[1]}};
    if (f[2] > 0) {
      one["gpu_mean_util_percent"] = f[3];
      one["gpu_max_util_percent"] = f[4];
      one["gpu_peak_memory_used_bytes"] = static_cast<int64_t>(f[5]);
      one["gpu_memory_total_bytes"] = static_cast<int64_t>(f[6]);
    }
    const int64_t* b = g.state.data() + r * 3;
    one["model_state_bytes"] = {{"params", b[0]}, {"grads", b[1]}, {"optimizer", b[2]}, {"total", b[0] + b[1] + b[2]}};
    resources.push_back(one);
  }
  return resources;
}

nlohmann::json or_null(double v) { return v < 0 ? nlohmann::json() : nlohmann::json(v); }

void add_mfu(nlohmann::json& s, const RunFacts& f, double achieved);

nlohmann::json summary_json(const RunFacts& f, const Gathered& g, const nlohmann::json& resources,
                            const nlohmann::json& time_breakdown, log::ResourceMonitor& monitor) {
  const auto sync = f.strategy.last_sync_bytes();
  std::vector<int64_t> peak_rss;
  for (const auto& r : resources) peak_rss.push_back(r["peak_rss_bytes"].get<int64_t>());
  const double ips = f.train_seconds > 0 ? f.images_seen / f.train_seconds : 0;
  nlohmann::json s = {
      {"world_size", f.info.world_size},
      {"nnodes", f.info.nnodes},
      {"launcher", f.info.launcher},
      {"strategy", f.strategy.name()},
      {"backend", f.comm.backend_name()},
      {"model", f.cfg.model.name},
      {"steps", f.steps},
      {"epochs", static_cast<double>(f.steps) / f.steps_per_epoch},
      {"steps_per_epoch", f.steps_per_epoch},
      {"global_batch", f.global_batch},
      {"train_seconds", f.train_seconds},
      {"images_per_second", ips},
      {"test_accuracy", or_null(f.test_accuracy)},
      {"best_test_accuracy", or_null(f.best)},
      {"peak_rss_bytes", peak_rss},
      {"resources", resources},
      {"gpu_monitor", monitor.gpu_available() ? "nvml" : monitor.nvml().why_unavailable()},
      {"precision", f.cfg.amp.precision},
      {"amp", f.precision.summary()},
      {"device", f.device.str()},
      {"bad_files_skipped", g.bad_files},
      {"threads_per_worker", at::get_num_threads()},
      {"optimizer", f.cfg.optim.name},
      {"clip_grad_norm", f.cfg.optim.clip_grad_norm},
      {"restarts", f.info.restart_count},
      {"compress", f.cfg.dist.compress},
      {"sync_bytes_per_step", sync.wire},
      {"sync_bytes_per_step_uncompressed", sync.dense},
      {"compression_ratio", sync.wire > 0 ? nlohmann::json(double(sync.dense) / sync.wire) : nlohmann::json()},
      {"config", f.config_json}};
  s["auto"] = f.chosen;
  s["channels_last"] = f.channels_last;
  s["time_breakdown"] = time_breakdown;
  s["stopped_by"] = f.stop_signal != 0 ? nlohmann::json(util::signal_name(f.stop_signal)) : nlohmann::json();
  // FLOPs as torch.utils.flop_counter counts them (Note [Counting FLOPs]), over every worker's time.
  s["flops_per_image"] = or_null(f.flops_per_image);
  s["achieved_tflops"] = f.flops_per_image < 0 ? nlohmann::json() : nlohmann::json(f.flops_per_image * ips / 1e12);
  if (f.flops_per_image > 0 && ips > 0) add_mfu(s, f, f.flops_per_image * ips);
  for (const auto& [name, value] : f.strategy.figures()) s[name] = value;  // the swarm's own figures
  return s;
}

// MFU: the FLOP/s reached over the workers' peak (Note [Which peak] in log/Peak.cpp).
void add_mfu(nlohmann::json& s, const RunFacts& f, double achieved) {
  const auto& peak = f.peak;
  s["mfu"] = peak ? nlohmann::json(achieved / (peak->flops * f.info.world_size)) : nlohmann::json();
  if (!peak) {
    s["peak_source"] = f.peak_why;
    return;
  }
  s["peak_tflops_per_worker"] = peak->flops / 1e12;
  s["peak_source"] = peak->source;
}

}  // namespace

void write_run_summary(const RunFacts& f, const PhaseClock& clock, log::ResourceMonitor& monitor, RunLog& log) {
  const auto time_breakdown = gather_time_breakdown(clock, f.comm);
  const Gathered g = gather(f, monitor);
  if (f.info.rank != 0) return;
  const auto resources = per_rank_resources(g, f.info.world_size);
  log.record({{"kind", "model_state"},
              {"step", f.steps},
              {"strategy", f.strategy.name()},
              {"per_rank", resources},
              {"time", std::time(nullptr)}});
  auto summary = summary_json(f, g, resources, time_breakdown, monitor);
  if (auto tracker = log.drain_trackers(); !tracker.is_null()) summary["mlflow"] = tracker;
  util::write_file_atomic(f.run_dir / "summary.json", summary.dump(2) + "\n");
  std::cout << "cohort: " << (f.stop_signal != 0 ? "stopped by " + util::signal_name(f.stop_signal) : "done") << ": "
            << f.steps << " steps in " << std::fixed << std::setprecision(1) << f.train_seconds << " s, "
            << std::setprecision(0) << summary["images_per_second"].get<double>() << " img/s, test top1 "
            << percent(f.test_accuracy) << " (best " << percent(f.best) << "); time: " << clock.line() << "; "
            << (f.run_dir / "summary.json").string() << std::defaultfloat << std::endl;
  if (g.bad_files > 0)
    std::cout << "cohort: " << g.bad_files << " bad image file(s) were skipped (named above; data.on_bad_file=fail "
              << "stops at the first)" << std::endl;
}

}  // namespace cohort::record

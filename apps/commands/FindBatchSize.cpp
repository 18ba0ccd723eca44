#include "FindBatchSize.h"

#include <filesystem>
#include <iomanip>
#include <iostream>

#include <nlohmann/json.hpp>

#include "Train.h"
#include "cohort/commands/BatchSizeFinder.h"
#include "cohort/util/AtomicFile.h"
#include "cohort/util/Error.h"

namespace apps {

// The largest batch search: trials are single-worker `cohort train` processes of this same binary.
int run_find_batch_size(const FindArgs& a) {
  namespace fs = std::filesystem;
  TrainArgs check;
  check.config_file = a.config_file;
  check.overrides = a.overrides;
  const auto cfg = resolve_config(check);  // a bad key fails here, once, not in every trial
  cohort::commands::FindOptions o;
  std::error_code ec;
  o.binary = fs::read_symlink("/proc/self/exe", ec).string();
  if (ec) o.binary = "/proc/self/exe";
  if (!a.config_file.empty()) o.train_args = {"--config", fs::absolute(a.config_file).string()};
  o.train_args.insert(o.train_args.end(), a.overrides.begin(), a.overrides.end());
  o.start = a.start;
  o.max_batch = a.max_batch;
  o.max_trials = a.max_trials;
  o.steps = a.steps;
  o.max_memory = a.max_memory.empty() ? cohort::commands::available_memory_bytes() * 9 / 10
                                      : cohort::commands::parse_bytes(a.max_memory);
  const fs::path run_dir =
      a.run_dir.empty() ? fs::path(cfg.run.dir.empty() ? "runs/find-batch-size" : cfg.run.dir) : fs::path(a.run_dir);
  fs::create_directories(run_dir);
  o.work_dir = run_dir / "batch-size-trials";
  std::cout << "cohort: find-batch-size for " << cfg.model.name << " on " << cfg.data.name << ": per-worker budget "
            << o.max_memory / double(1 << 20) << " MiB of peak RSS, " << o.steps << " steps per trial" << std::endl;
  const auto r = cohort::commands::find_batch_size(o, [&](int64_t b) {
    auto t = cohort::commands::run_trial(o, b);
    std::cout << "  batch " << b << ": " << (t.fits ? "fits" : "does not fit (" + t.why + ")") << ", peak RSS "
              << t.peak_rss / (1 << 20) << " MiB, " << std::fixed << std::setprecision(1) << t.seconds << " s"
              << std::defaultfloat << std::endl;
    return t;
  });
  fs::remove_all(o.work_dir, ec);
  cohort::util::write_file_atomic(run_dir / "batch_size.json", to_json(r, o).dump(2) + "\n");
  if (r.batch_size == 0)
    throw cohort::ConfigError("find-batch-size: not even data.batch_size=" + std::to_string(r.trials.back().batch) +
                                  " fits: " + r.trials.back().why,
                              "raise --max-memory or pick a smaller model");
  std::cout << "cohort: largest per-worker batch: " << r.batch_size << " (limited by " << r.limited_by << "); "
            << (run_dir / "batch_size.json").string() << std::endl;
  return 0;
}

CLI::App* add_find_batch_size_command(CLI::App& app, FindArgs& find) {
  auto* finder = app.add_subcommand("find-batch-size",
                                    "find the largest per-worker batch that trains within a memory budget "
                                    "(doubling, then binary search); writes batch_size.json into the run dir");
  finder->add_option("--config", find.config_file, "TOML config file")->check(CLI::ExistingFile);
  finder->add_option("--max-memory", find.max_memory,
                     "peak resident memory allowed per worker, e.g. 4G (default: 90% of MemAvailable)");
  finder->add_option("--start", find.start, "first batch size tried")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  finder->add_option("--max-batch", find.max_batch, "largest batch size tried")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  finder->add_option("--max-trials", find.max_trials, "trials at most")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  finder->add_option("--steps", find.steps, "training steps per trial")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  finder->add_option("--run-dir", find.run_dir,
                     "where batch_size.json goes (default: run.dir, else runs/find-batch-size)");
  finder->add_option("overrides", find.overrides, "config overrides, key=value, as for train");
  return finder;
}

}  // namespace apps

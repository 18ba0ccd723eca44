// `cohort find-batch-size`: the largest per-worker batch that trains a few steps within a memory
// budget, found as Lightning's batch-size tuner does ("binsearch"): double from a small batch until a
// trial does not fit, then binary search between the last batch that fit and the first that did not.
//
// Each trial is a real single-worker `cohort train` process running `steps` steps, so what is measured
// is what a worker of the real job uses. On CPU a trial fits when its peak resident memory stays within
// `max_memory` (a watchdog kills it as soon as it goes over, so a huge batch never swaps the machine);
// on a GPU, when it does not run out of device memory.
//
//   cohort::commands::FindOptions o;
//   o.binary = "/proc/self/exe"; o.train_args = {"model.name=resnet18"}; o.max_memory = 4LL << 30;
//   auto r = cohort::commands::find_batch_size(o, [&](int64_t b) { return cohort::commands::run_trial(o, b); });
//   std::cout << r.batch_size;
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace cohort::commands {

struct FindOptions {
  std::string binary;                   // the cohort executable
  std::vector<std::string> train_args;  // --config FILE and key=value overrides, as for `cohort train`
  int64_t start = 2;                    // first batch tried
  int64_t max_batch = 1 << 20;          // never try more than this
  int max_trials = 25;                  // Lightning's default
  int64_t steps = 3;                    // training steps per trial
  int64_t max_memory = 0;               // bytes of peak RSS per worker (CPU)
  double trial_timeout_s = 900;
  std::filesystem::path work_dir;  // trials run in subfolders, removed after each
};

struct Trial {
  int64_t batch = 0;
  bool fits = false;
  int64_t peak_rss = 0;  // bytes, the trial process's maximum resident set
  double seconds = 0;
  std::string why;             // why it did not fit: "peak RSS 3.1 GiB > budget 3.0 GiB", "out of memory", ...
  bool dataset_limit = false;  // the batch is larger than the training set: no larger one can fit
};

struct FindResult {
  int64_t batch_size = 0;  // the largest batch that fit; 0 if none did
  std::vector<Trial> trials;
  std::string limited_by;  // "memory", "dataset", "max_batch", "max_trials"
};

// The search alone, over any trial function (tests pass a synthetic one).
FindResult find_batch_size(const FindOptions& options, const std::function<Trial(int64_t)>& run);

// One trial as a child `cohort train` process with data.batch_size=batch. Throws cohort::Error when the
// trial fails for a reason other than memory (a bad config, a missing dataset), with its message.
Trial run_trial(const FindOptions& options, int64_t batch);

nlohmann::json to_json(const FindResult& r, const FindOptions& options);

// "4G", "512MiB", "1.5GB", "1048576": bytes (binary multiples for K/M/G/T, as `free -h` shows memory).
int64_t parse_bytes(const std::string& text);
// MemAvailable from /proc/meminfo, in bytes (0 if unreadable).
int64_t available_memory_bytes();

}  // namespace cohort::commands

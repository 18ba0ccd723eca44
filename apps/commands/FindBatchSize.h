// `cohort find-batch-size`: the largest per-worker batch that trains within a memory budget. Each trial is a
// single-worker `cohort train` process of this same binary (commands/BatchSizeFinder.h searches).
//
//   apps::FindArgs find;
//   auto* finder = apps::add_find_batch_size_command(app, find);
//   app.parse(argc, argv);
//   if (*finder) return apps::run_find_batch_size(find);
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace apps {

struct FindArgs {
  std::string config_file;
  std::vector<std::string> overrides;
  std::string max_memory;
  int64_t start = 2;
  int64_t max_batch = 1 << 20;
  int max_trials = 25;
  int64_t steps = 3;
  std::string run_dir;
};

CLI::App* add_find_batch_size_command(CLI::App& app, FindArgs& find);
int run_find_batch_size(const FindArgs& a);

}  // namespace apps

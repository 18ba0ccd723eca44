// `cohort train`, `eval` and `predict`: the commands that start workers. Started by a person, each starts
// the workers through the launcher (itself again, with RANK, WORLD_SIZE...); started as a worker by the
// launcher, torchrun, Slurm or mpirun (recognised by their environment), it does the work. main.cpp adds
// them to the CLI and runs the one given.
//
//   apps::TrainArgs args;
//   auto* train = apps::add_train_command(app, args);
//   app.parse(argc, argv);
//   if (*train) return apps::run_job(args, apps::Job::train);
#pragma once

#include <exception>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cohort/config/Config.h"

namespace apps {

struct TrainArgs {
  std::string config_file;
  std::vector<std::string> overrides;
  int nproc_per_node = 2;
  int max_restarts = 0;
  std::string nnodes_spec = "1";  // "N" or "MIN:MAX" (train)
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  std::string token_file;
  std::string run_dir;
  std::string resume;
  std::string s3_endpoint;
  std::string checkpoint;           // eval, predict
  std::string out;                  // eval, predict
  std::vector<std::string> images;  // predict
  std::string input;                // predict
  int top_k = 5;                    // predict
  int64_t batch_size = 32;          // predict
};

enum class Job { train, eval, predict };

// The resolved config: a resumed run's saved config (or the defaults), then the file, then key=value
// overrides, then the --run-dir/--resume flags.
cohort::TrainConfig resolve_config(const TrainArgs& a);
// What an error says to a person: cohort's errors with their hint, LibTorch's without its C++ stack.
std::string message_of(const std::exception& e);
// The exit code of train, eval or predict (started by a person, or as a worker).
int run_job(const TrainArgs& args, Job job);
// `cohort predict`: its positional words are key=value overrides, unless a file or folder of that name exists.
int run_predict_command(TrainArgs args);

// Each command's options, declared into the arguments it fills.
CLI::App* add_train_command(CLI::App& app, TrainArgs& args);
CLI::App* add_eval_command(CLI::App& app, TrainArgs& args);
CLI::App* add_predict_command(CLI::App& app, TrainArgs& args);

}  // namespace apps

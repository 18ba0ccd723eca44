// `cohort`: the command-line front end. `cohort train` is both the launcher (started by a person) and
// the worker (started by the launcher, torchrun, Slurm or mpirun, recognised by their environment).
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>

#include <CLI/CLI.hpp>
#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>
#include <torch/version.h>

#include "cohort/comm/WorldInfo.h"
#include "cohort/config/Config.h"
#include "cohort/launch/Launcher.h"
#include "cohort/train/Trainer.h"
#include "cohort/util/Error.h"

namespace {

struct TrainArgs {
  std::string config_file;
  std::vector<std::string> overrides;
  int nproc_per_node = 2;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  std::string run_dir;
  std::string resume;
};

// The resolved config: a resumed run's saved config (or the defaults), then the file, then key=value
// overrides, then the --run-dir/--resume flags.
cohort::TrainConfig resolve_config(const TrainArgs& a) {
  cohort::TrainConfig base;
  if (!a.resume.empty()) {
    const auto saved = std::filesystem::path(a.resume) / "config.json";
    if (std::filesystem::exists(saved)) {
      std::ifstream in(saved);
      auto j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded())
        throw cohort::ConfigError(saved.string() + " is not valid JSON", "resume from an intact run directory");
      j.erase("run.dir");
      j.erase("train.resume");
      base = cohort::config::from_json(j);
    }
  }
  std::vector<std::string> overrides = a.overrides;
  if (!a.run_dir.empty()) overrides.push_back("run.dir=" + a.run_dir);
  if (!a.resume.empty()) overrides.push_back("train.resume=" + a.resume);
  return cohort::config::load(a.config_file.empty() ? std::nullopt : std::optional<std::filesystem::path>(a.config_file),
                              overrides, base);
}

std::string message_of(const std::exception& e) {
  if (const auto* ce = dynamic_cast<const cohort::Error*>(&e)) return ce->describe();
  if (const auto* te = dynamic_cast<const c10::Error*>(&e)) return te->what_without_backtrace();
  return e.what();
}

int run_train(const TrainArgs& args) {
  const auto info = cohort::world_from_env(cohort::current_env());
  if (info.launcher == "none") {
    // A person started us: check the config once, here, then start the workers.
    resolve_config(args);
    cohort::launch::LaunchOptions o;
    o.nproc_per_node = args.nproc_per_node;
    o.nnodes = args.nnodes;
    o.node_rank = args.node_rank;
    o.master_addr = args.master_addr;
    o.master_port = args.master_port;
    return cohort::launch::launch_with_argv(o);
  }
  try {
    cohort::train::run_worker(resolve_config(args), info);
    return 0;
  } catch (const std::exception& e) {
    const std::string msg = "rank " + std::to_string(info.rank) + ": " + message_of(e);
    std::cerr << "cohort: error on " << msg << std::endl;
    cohort::launch::record_worker_error(info.rank, msg);
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"cohort: data-parallel training of image classifiers across processes and machines"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("cohort 0.1.0 (LibTorch ") + TORCH_VERSION + ")");

  TrainArgs args;
  auto* train = app.add_subcommand("train", "train a model; with no arguments, the default job (2 local workers, "
                                            "ResNet-8 on Fashion-MNIST)");
  train->add_option("--config", args.config_file, "TOML config file")->check(CLI::ExistingFile);
  train->add_option("--nproc-per-node", args.nproc_per_node, "worker processes on this machine")
      ->capture_default_str()->check(CLI::Range(1, 1024));
  train->add_option("--nnodes", args.nnodes, "machines in the job")->capture_default_str()->check(CLI::Range(1, 65536));
  train->add_option("--node-rank", args.node_rank, "this machine's index, 0..nnodes-1")->capture_default_str();
  train->add_option("--master-addr", args.master_addr, "address of node 0, where rank 0 hosts the rendezvous store")
      ->capture_default_str();
  train->add_option("--master-port", args.master_port, "port of the rendezvous store (0: a free one, single machine)")
      ->capture_default_str()->check(CLI::Range(0, 65535));
  train->add_option("--run-dir", args.run_dir, "run directory (default runs/<timestamp>); same as run.dir=");
  train->add_option("--resume", args.resume, "run directory to resume from; same as train.resume=");
  train->add_option("overrides", args.overrides, "config overrides, key=value (see the list below)");
  train->footer(cohort::config::help_text());

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    if (*train) return run_train(args);
  } catch (const std::exception& e) {
    std::cerr << "cohort: error: " << message_of(e) << std::endl;
    return 2;
  }
  return 0;
}

#include "Train.h"

#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include "cohort/comm/WorldInfo.h"
#include "cohort/commands/Eval.h"
#include "cohort/commands/Predict.h"
#include "cohort/launch/Launcher.h"
#include "cohort/train/Trainer.h"
#include "cohort/util/Error.h"

namespace apps {
namespace {

// The worker's part of `cohort predict`.
void run_predict(const TrainArgs& args, const cohort::comm::WorldInfo& info) {
  cohort::commands::PredictOptions p;
  p.checkpoint = args.checkpoint;
  p.images.assign(args.images.begin(), args.images.end());
  p.input = args.input;
  p.out = args.out;
  p.top_k = args.top_k;
  p.batch_size = args.batch_size;
  cohort::commands::run_predict_worker(resolve_config(args), info, p);
}

}  // namespace

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
  if (!a.s3_endpoint.empty()) overrides.push_back("ckpt.s3_endpoint=" + a.s3_endpoint);
  return cohort::config::load(
      a.config_file.empty() ? std::nullopt : std::optional<std::filesystem::path>(a.config_file), overrides, base);
}

std::string message_of(const std::exception& e) {
  if (const auto* ce = dynamic_cast<const cohort::Error*>(&e)) return ce->describe();
  // LibTorch's errors carry the C++ stack where they were raised; shown, as PyTorch does, only when asked.
  if (const auto* te = dynamic_cast<const c10::Error*>(&e)) {
    const char* stack = std::getenv("TORCH_SHOW_CPP_STACKTRACES");
    return stack && std::string(stack) == "1" ? te->what() : te->what_without_backtrace();
  }
  return e.what();
}

// `cohort train`, `eval` and `predict` share the launcher: started by a person, the command starts the
// workers (itself again, with RANK, WORLD_SIZE...); started as a worker, it does the work.
int run_job(const TrainArgs& args, Job job) {
  const bool eval = job != Job::train;
  // The launcher and its workers (which see the same command line) read the secret from here.
  if (!args.token_file.empty()) setenv("COHORT_TOKEN_FILE", std::filesystem::absolute(args.token_file).c_str(), 1);
  const auto info = cohort::comm::world_from_env(cohort::comm::current_env());
  if (info.launcher == "none") {
    // A person started us: check the config once, here, then start the workers.
    const auto cfg = resolve_config(args);
    cohort::launch::LaunchOptions o;
    o.max_restarts = args.max_restarts;
    // Restarted workers resume from the run's checkpoints, so every attempt must use the same run dir:
    // the launcher picks it once instead of each attempt stamping a new one.
    if (o.max_restarts > 0 && cfg.run.dir.empty() && !eval) {
      char stamp[32];
      const std::time_t now = std::time(nullptr);
      std::strftime(stamp, sizeof stamp, "runs/%Y%m%d-%H%M%S", std::localtime(&now));
      o.extra_args.push_back(std::string("run.dir=") + stamp);
    }
    o.nproc_per_node = args.nproc_per_node;
    cohort::launch::set_nnodes(args.nnodes_spec, o);
    if (o.min_nodes > 0 && args.max_restarts == 0)
      std::cerr << "cohort: note: --nnodes MIN:MAX without --max-restarts never re-forms the group" << std::endl;
    o.rdzv_timeout_s = cfg.dist.timeout_s;
    o.node_rank = args.node_rank;
    o.master_addr = args.master_addr;
    o.master_port = args.master_port;
    return cohort::launch::launch_with_argv(o);
  }
  try {
    if (job == Job::eval)
      cohort::commands::run_eval_worker(resolve_config(args), info, args.checkpoint, args.out);
    else if (job == Job::predict)
      run_predict(args, info);
    else
      cohort::train::run_worker(resolve_config(args), info);
    return 0;
  } catch (const std::exception& e) {
    const std::string msg = "rank " + std::to_string(info.rank) + ": " + message_of(e);
    std::cerr << "cohort: error on " << msg << std::endl;
    cohort::launch::record_worker_error(info.rank, msg);
    return 1;
  }
}

int run_predict_command(TrainArgs args) {
  std::vector<std::string> images;
  for (auto& w : args.images)
    (w.find('=') != std::string::npos && !std::filesystem::exists(w) ? args.overrides : images).push_back(w);
  args.images = images;
  if (args.images.empty() == args.input.empty())
    throw cohort::ConfigError("cohort predict needs image files or folders, or --input, and not both",
                              "for example: cohort predict --checkpoint runs/x photos/");
  return run_job(args, Job::predict);
}

CLI::App* add_train_command(CLI::App& app, TrainArgs& args) {
  auto* train = app.add_subcommand("train",
                                   "train a model; with no arguments, the default job (2 local workers, "
                                   "ResNet-8 on Fashion-MNIST)");
  train->add_option("--config", args.config_file, "TOML config file")->check(CLI::ExistingFile);
  train->add_option("--nproc-per-node", args.nproc_per_node, "worker processes on this machine")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  train
      ->add_option("--nnodes", args.nnodes_spec,
                   "machines in the job: N, or MIN:MAX to carry on (with --max-restarts) as long as MIN remain")
      ->capture_default_str();
  train->add_option("--node-rank", args.node_rank, "this machine's index, 0..nnodes-1")->capture_default_str();
  train->add_option("--master-addr", args.master_addr, "address of node 0, where rank 0 hosts the rendezvous store")
      ->capture_default_str();
  train->add_option("--master-port", args.master_port, "port of the rendezvous store (0: a free one, single machine)")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535));
  train
      ->add_option("--token-file", args.token_file,
                   "file (mode 600) holding the job's shared secret for the rendezvous store; required on every "
                   "machine of a multi-machine job unless COHORT_TOKEN is set")
      ->check(CLI::ExistingFile);
  train->add_option("--run-dir", args.run_dir, "run directory (default runs/<timestamp>); same as run.dir=");
  train
      ->add_option("--max-restarts", args.max_restarts,
                   "when a worker fails, restart all workers this many times; they resume from the last checkpoint")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000));
  train->add_option("--resume", args.resume, "run directory to resume from; same as train.resume=");
  train->add_option("overrides", args.overrides, "config overrides, key=value (see the list below)");
  train->add_option("--s3-endpoint", args.s3_endpoint,
                    "S3-compatible endpoint for ckpt.upload; same as ckpt.s3_endpoint=");
  train->footer(cohort::config::help_text());
  return train;
}

CLI::App* add_eval_command(CLI::App& app, TrainArgs& args) {
  args.nproc_per_node = 1;  // one worker unless asked: the defaults shown by --help are set here
  auto* evaluator = app.add_subcommand("eval", "top-1 and top-5 of a checkpoint on the validation set, across ranks");
  evaluator
      ->add_option("--checkpoint", args.checkpoint,
                   "model weights (.safetensors, e.g. RUN/checkpoints/best.safetensors), or a run directory "
                   "(its best checkpoint, else last; sharded ones are reassembled)")
      ->required()
      ->check(CLI::ExistingPath);
  evaluator->add_option("--config", args.config_file, "TOML config file (the model and data of the checkpoint)")
      ->check(CLI::ExistingFile);
  evaluator->add_option("--nproc-per-node", args.nproc_per_node, "worker processes on this machine")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  evaluator->add_option("--nnodes", args.nnodes_spec, "machines")->capture_default_str();
  evaluator->add_option("--node-rank", args.node_rank, "this machine's index")->capture_default_str();
  evaluator->add_option("--master-addr", args.master_addr, "address of node 0")->capture_default_str();
  evaluator->add_option("--master-port", args.master_port, "rendezvous port (0: a free one)")->capture_default_str();
  evaluator->add_option("--token-file", args.token_file, "file holding the job's shared secret, as for train")
      ->check(CLI::ExistingFile);
  evaluator->add_option("--out", args.out, "also write the result as JSON to this file");
  evaluator->add_option("overrides", args.overrides, "config overrides, key=value, as for train");
  return evaluator;
}

CLI::App* add_predict_command(CLI::App& app, TrainArgs& args) {
  args.nproc_per_node = 1;
  auto* predictor = app.add_subcommand(
      "predict",
      "top-k classes of a trained model for JPEG images (JSON lines), or its logits for a safetensors "
      "file of preprocessed images");
  predictor
      ->add_option("--checkpoint", args.checkpoint,
                   "model weights (.safetensors), or a run directory (its best checkpoint, else last)")
      ->required()
      ->check(CLI::ExistingPath);
  predictor->add_option("inputs", args.images,
                        "JPEG files or folders of them, and config overrides key=value as for train (the model "
                        "and data of the checkpoint)");
  predictor
      ->add_option("--input", args.input,
                   "instead of images: a safetensors file of one float tensor [N, C, H, W], already "
                   "preprocessed; the logits go to --out (default <input>.logits.safetensors)")
      ->check(CLI::ExistingFile);
  predictor->add_option("--out", args.out, "write here instead of standard output");
  predictor->add_option("--top-k", args.top_k, "classes per image")->capture_default_str()->check(CLI::PositiveNumber);
  predictor->add_option("--batch-size", args.batch_size, "images per forward pass")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  predictor->add_option("--config", args.config_file, "TOML config file (the model and data of the checkpoint)")
      ->check(CLI::ExistingFile);
  predictor->add_option("--nproc-per-node", args.nproc_per_node, "worker processes on this machine")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  predictor->add_option("--master-port", args.master_port, "rendezvous port (0: a free one)")->capture_default_str();
  return predictor;
}

}  // namespace apps

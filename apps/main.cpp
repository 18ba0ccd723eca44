// `cohort`: the command-line front end. `cohort train` is both the launcher (started by a person) and
// the worker (started by the launcher, torchrun, Slurm or mpirun, recognised by their environment).
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <optional>

#include <c10/util/Exception.h>
#include <torch/version.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "DoctorCommand.h"
#include "SwarmCommands.h"
#include "cohort/checkpoint/Names.h"
#include "cohort/checkpoint/ShardedCheckpoint.h"
#include "cohort/checkpoint/Steps.h"
#include "cohort/comm/WorldInfo.h"
#include "cohort/commands/BatchSizeFinder.h"
#include "cohort/commands/Eval.h"
#include "cohort/commands/Predict.h"
#include "cohort/config/Config.h"
#include "cohort/launch/Launcher.h"
#include "cohort/log/Report.h"
#include "cohort/record/StepTrace.h"
#include "cohort/train/Trainer.h"
#include "cohort/util/AtomicFile.h"
#include "cohort/util/Error.h"

namespace {

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

struct ReportArgs {
  std::vector<std::string> run_dirs;
  std::string out;
};

struct ExportArgs {
  std::string from, tag = cohort::checkpoint::names::kLast, out;
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

// `cohort train`, `eval` and `predict` share the launcher: started by a person, the command starts the
// workers (itself again, with RANK, WORLD_SIZE...); started as a worker, it does the work.
int run_job(const TrainArgs& args, Job job = Job::train) {
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

// Each subcommand's options, declared into the arguments it fills; main() parses and runs the one given.

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

CLI::App* add_report_command(CLI::App& app, ReportArgs& report) {
  auto* reporter = app.add_subcommand("report",
                                      "write the run logbook (report.md, report.json, SVG plots) of one "
                                      "run, or a comparison of several with speedups");
  reporter->add_option("run_dirs", report.run_dirs, "run directories (the first is the baseline of the speedups)")
      ->required()
      ->check(CLI::ExistingDirectory);
  reporter->add_option("--out", report.out, "output folder (default: the run dir for one run, ./report for several)");
  return reporter;
}

CLI::App* add_export_command(CLI::App& app, ExportArgs& e) {
  auto* exporter = app.add_subcommand("export",
                                      "write one full safetensors file of a checkpoint's weights (from a "
                                      "sharded zero1/zero2/fsdp save, or an ordinary one)");
  exporter->add_option("checkpoint", e.from, "run directory or its checkpoints/ directory")
      ->required()
      ->check(CLI::ExistingDirectory);
  exporter->add_option("--tag", e.tag, "which checkpoint: last or best")->capture_default_str();
  exporter->add_option("--out", e.out, "output file (default: <checkpoints>/<tag>.full.safetensors)");
  return exporter;
}

// `cohort predict`: its positional words are key=value overrides, unless a file or folder of that name exists.
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

int run_export(const ExportArgs& e) {
  namespace ck = cohort::checkpoint;
  const auto dir = ck::resolve_resume_dir(e.from);
  const auto c = e.tag == ck::names::kLast ? ck::load_latest(dir).checkpoint : ck::load_any(dir, e.tag);
  const std::filesystem::path out = e.out.empty() ? dir / ck::names::export_file(e.tag) : std::filesystem::path(e.out);
  ck::export_weights(c, out);
  std::cout << "cohort: exported " << c.model.size() << " tensors of step " << c.state.step << " (saved by "
            << c.state.world_size << " worker(s)) to " << out.string() << std::endl;
  return 0;
}

int run_report(const ReportArgs& report) {
  const auto out = cohort::log::write_report(
      std::vector<std::filesystem::path>(report.run_dirs.begin(), report.run_dirs.end()),
      report.out.empty() ? (report.run_dirs.size() == 1 ? report.run_dirs[0] : std::string("report")) : report.out);
  std::cout << "cohort: report written: " << out.string() << std::endl;
  // log.trace_steps: the ranks' traces of a run, merged into one for Perfetto or chrome://tracing.
  for (const auto& dir : report.run_dirs)
    if (const auto trace = cohort::record::merge_step_traces(dir); !trace.is_null()) {
      const auto path = std::filesystem::path(dir) / "trace.json";
      cohort::util::write_file_atomic(path, trace.dump() + "\n");
      std::cout << "cohort: trace of steps " << trace["otherData"]["steps"][0] << " to "
                << trace["otherData"]["steps"][1] << " (" << trace["otherData"]["ranks"].size()
                << " rank(s)) written: " << path.string() << " (open it in https://ui.perfetto.dev or chrome://tracing)"
                << std::endl;
    }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"cohort: data-parallel training of image classifiers across processes and machines"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("cohort " COHORT_VERSION " (LibTorch ") + TORCH_VERSION + ")");
  TrainArgs train_args, eval_args, predict_args;
  FindArgs find;
  ReportArgs report;
  ExportArgs exported;
  SwarmCommands swarm_commands;
  DoctorCommand doctor;
  auto* train = add_train_command(app, train_args);
  auto* evaluator = add_eval_command(app, eval_args);
  auto* predictor = add_predict_command(app, predict_args);
  auto* finder = add_find_batch_size_command(app, find);
  auto* reporter = add_report_command(app, report);
  auto* exporter = add_export_command(app, exported);
  add_swarm_commands(app, swarm_commands);
  add_doctor_command(app, doctor);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    if (*train) return run_job(train_args);
    if (*evaluator) return run_job(eval_args, Job::eval);
    if (*predictor) return run_predict_command(predict_args);
    if (*finder) return run_find_batch_size(find);
    if (const int rc = run_swarm_commands(swarm_commands); rc >= 0) return rc;
    if (const int rc = run_doctor_command(doctor); rc >= 0) return rc;
    if (*exporter) return run_export(exported);
    if (*reporter) return run_report(report);
  } catch (const std::exception& e) {
    std::cerr << "cohort: error: " << message_of(e) << std::endl;
    return 2;
  }
  return 0;
}

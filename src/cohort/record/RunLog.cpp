#include "cohort/record/RunLog.h"

#include <cstdlib>
#include <ctime>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "cohort/checkpoint/Names.h"
#include "cohort/log/Report.h"
#include "cohort/util/AtomicFile.h"

namespace cohort::record {

namespace fs = std::filesystem;

namespace {

// Note [Resource samples reach rank 0 at log intervals]
// Every rank's monitor thread writes its own resources.rank<R>.jsonl at log.monitor_s; rank 0 alone
// writes metrics.jsonl and TensorBoard, so the latest sample of every rank travels to it in the same
// place the training metrics are reduced: a collective every rank reaches at the same step.
constexpr int kResourceFields = 5;  // rss, peak rss, cpu %, gpu util % (-1: none), gpu memory used

std::vector<double> gather_resources(log::ResourceMonitor& monitor, comm::Communicator& comm, int world_size) {
  const auto s = monitor.sample_now(/*record=*/false);
  auto mine = at::tensor({double(s.rss), double(s.peak_rss), s.cpu_percent, s.gpu ? s.gpu->util_percent : -1.0,
                          s.gpu ? double(s.gpu->memory_used) : 0.0},
                         at::kDouble);
  auto all = at::zeros({world_size * kResourceFields}, at::kDouble);
  comm.all_gather(all, mine, "resource samples")->wait();
  return std::vector<double>(all.data_ptr<double>(), all.data_ptr<double>() + all.numel());
}

}  // namespace

std::string percent(double fraction) {
  if (fraction < 0) return "n/a";
  std::ostringstream os;
  os << std::fixed << std::setprecision(2) << 100.0 * fraction << "%";
  return os.str();
}

// The peers of one swarm (or DiLoCo job) are runs of their own, tagged with one name: the strategy and a
// hash of the config they must share (every key but the machine-local ones), the same on every peer.
// std::hash of a string is libstdc++'s murmur hash, the same on every machine of one build.
RunLog::Tags tracker_tags(const RunIdentity& run) {
  RunLog::Tags tags = {{"cohort.version", COHORT_VERSION}, {"cohort.world_size", std::to_string(run.world_size)},
                       {"cohort.strategy", run.strategy},  {"cohort.precision", run.precision},
                       {"cohort.launcher", run.launcher},  {"cohort.run_dir", fs::absolute(run.run_dir).string()}};
  if (const char* user = std::getenv("USER")) tags.emplace_back("mlflow.user", user);  // MLflow's own "User"
  if (run.groups_runs) {
    nlohmann::json shared = run.config_json;
    for (const auto& key : config::machine_local_keys()) shared.erase(key);
    std::ostringstream name;
    name << run.cfg.dist.strategy << "-" << std::hex << std::hash<std::string>{}(shared.dump());
    tags.emplace_back("cohort.swarm", name.str());
  }
  return tags;
}

RunLog::RunLog(const TrainConfig& cfg, const std::filesystem::path& run_dir, int world_size, bool lead,
               bool plain_lines)
    : world_size_(world_size), lead_(lead), plain_lines_(plain_lines), run_dir_(run_dir) {
  if (!lead_) return;
  metrics_ = JsonLines(run_dir / "metrics.jsonl");
  if (cfg.log.tensorboard) tensorboard_ = std::make_unique<log::EventWriter>(run_dir);
  if (!cfg.log.mlflow.empty())
    mlflow_options_ = {cfg.log.mlflow, cfg.log.mlflow_experiment,
                       cfg.log.mlflow_run_name.empty() ? run_dir.filename().string() : cfg.log.mlflow_run_name,
                       static_cast<size_t>(cfg.log.mlflow_buffer), cfg.log.mlflow_timeout_s};
}

RunLog::~RunLog() = default;

void RunLog::started(const nlohmann::json& config_json, const std::string& first_line, const Tags& tracker_tags) {
  if (!lead_) return;
  util::write_file_atomic(run_dir_ / "config.json", config_json.dump(2) + "\n");
  std::cout << first_line << std::endl;
  if (mlflow_options_.uri.empty()) return;
  mlflow_ = std::make_unique<log::MlflowRun>(mlflow_options_, tracker_tags);
  Tags params;
  for (const auto& [key, value] : config_json.items())
    params.emplace_back(key, value.is_string() ? value.get<std::string>() : value.dump());
  mlflow_->params(params);
}

// Every scalar goes to each sink the run has: TensorBoard and MLflow.
void RunLog::scalar(const std::string& tag, double value, int64_t step) {
  if (tensorboard_) tensorboard_->add_scalar(tag, value, step);
  if (mlflow_) mlflow_->metric(tag, value, step);
}

nlohmann::json RunLog::drain_trackers() {
  if (!mlflow_) return nullptr;
  mlflow_->drain();
  auto stats = mlflow_->stats();
  for (const char* later : {"artifacts", "status"}) stats.erase(later);  // known after close_trackers
  return stats;
}

// The run's files the tracker keeps: the summary and config, the metrics, a report with its plots, the
// best weights.
void RunLog::close_trackers(const std::string& status) {
  if (!mlflow_) return;
  std::vector<std::pair<fs::path, std::string>> files = {
      {run_dir_ / "summary.json", "summary.json"},
      {run_dir_ / "config.json", "config.json"},
      {run_dir_ / "metrics.jsonl", "metrics.jsonl"},
      {run_dir_ / checkpoint::names::kCheckpointsDir / checkpoint::names::weights_file(checkpoint::names::kBest),
       "checkpoints/" + checkpoint::names::weights_file(checkpoint::names::kBest)}};
  try {
    const fs::path report = log::write_report({run_dir_}, run_dir_ / "report");
    for (const auto& f : fs::directory_iterator(report.parent_path()))
      files.emplace_back(f.path(), "report/" + f.path().filename().string());
  } catch (const std::exception& e) {
    std::cerr << "cohort: warning: no report for MLflow: " << e.what() << std::endl;
  }
  mlflow_->close(status, files);
  const auto stats = mlflow_->stats();
  std::cout << "cohort: MLflow run " << stats["run_id"].get<std::string>() << " at " << mlflow_options_.uri << ": "
            << stats["sent"] << " records, " << stats["artifacts"] << " files, " << stats["status"].get<std::string>()
            << std::endl;
}

void RunLog::train_window(const TrainWindow& w, MetricWindow& window, log::ResourceMonitor& monitor,
                          comm::Communicator& comm) {
  const auto g = window.reduce(comm, "training metrics");
  const auto resources = gather_resources(monitor, comm, world_size_);
  window.reset();
  if (!lead_) return;
  nlohmann::json rec = {{"kind", "train"},
                        {"step", w.step},
                        {"epoch", w.epoch},
                        {"loss", g.loss()},
                        {"top1", g.top1()},
                        {"top5", g.top5()},
                        {"lr", w.lr},
                        {"images_per_second", w.images_per_second},
                        {"step_loss_rank0", w.step_loss},
                        {"train_seconds", w.train_seconds},
                        {"sync_bytes", w.sync_bytes},
                        {"sync_bytes_uncompressed", w.sync_bytes_uncompressed},
                        {"grad_norm", w.grad_norm < 0 ? nlohmann::json() : nlohmann::json(w.grad_norm)},
                        {"time", std::time(nullptr)}};
  if (w.loss_scaling) {
    rec["loss_scale"] = w.loss_scale;
    rec["skipped_steps"] = w.skipped_steps;
  }
  for (const auto& [name, value] : w.strategy_figures) rec[name] = value;
  const double tflops = w.flops_per_image > 0 ? w.flops_per_image * w.images_per_second / 1e12 : -1;
  // MFU as Lightning's ThroughputMonitor and torchtitan log it: this window's FLOP/s over the peak.
  const double mfu = tflops > 0 && w.peak_flops > 0 ? tflops * 1e12 / w.peak_flops : -1;
  if (tflops >= 0) rec["achieved_tflops"] = tflops;
  if (mfu >= 0) rec["mfu"] = mfu;
  metrics_.write(rec);
  write_resources(w.step, w.train_seconds, resources);
  scalar("train/loss", g.loss(), w.step);
  scalar("train/top1", g.top1(), w.step);
  scalar("train/top5", g.top5(), w.step);
  scalar("train/lr", w.lr, w.step);
  scalar("train/images_per_second", w.images_per_second, w.step);
  scalar("train/sync_bytes", static_cast<double>(w.sync_bytes), w.step);
  if (w.loss_scaling) scalar("amp/loss_scale", w.loss_scale, w.step);
  if (tflops >= 0) scalar("train/achieved_tflops", tflops, w.step);
  if (mfu >= 0) scalar("train/mfu", mfu, w.step);
  // "swarm_rounds" becomes "swarm/rounds": one TensorBoard section per strategy.
  for (const auto& [name, value] : w.strategy_figures) {
    const auto cut = name.find('_');
    scalar(cut == std::string::npos ? name : name.substr(0, cut) + "/" + name.substr(cut + 1), value, w.step);
  }
  if (plain_lines_)
    std::cout << "epoch " << w.epoch + 1 << "/" << w.epochs << " step " << w.step << "/" << w.total_steps << " loss "
              << std::fixed << std::setprecision(4) << g.loss() << " top1 " << percent(g.top1()) << " lr "
              << std::setprecision(5) << w.lr << " " << std::setprecision(0) << w.images_per_second << " img/s"
              << (mfu >= 0 ? " MFU " + percent(mfu) : "") << std::defaultfloat << std::endl;
}

// One "resources" record with every rank's latest sample, and its TensorBoard scalars per rank.
void RunLog::write_resources(int64_t step, double train_seconds, const std::vector<double>& all) {
  nlohmann::json rss = nlohmann::json::array(), cpu = nlohmann::json::array(), gpu_util = nlohmann::json::array(),
                 gpu_mem = nlohmann::json::array();
  for (int r = 0; r < world_size_; ++r) {
    const double* f = all.data() + r * kResourceFields;
    rss.push_back(static_cast<int64_t>(f[0]));
    cpu.push_back(f[2]);
    if (f[3] >= 0) {
      gpu_util.push_back(f[3]);
      gpu_mem.push_back(static_cast<int64_t>(f[4]));
    }
    const std::string who = "/rank" + std::to_string(r);
    scalar("memory/rss_mb" + who, f[0] / (1 << 20), step);
    scalar("memory/peak_rss_mb" + who, f[1] / (1 << 20), step);
    scalar("cpu/percent" + who, f[2], step);
    if (f[3] >= 0) {
      scalar("gpu/util_percent" + who, f[3], step);
      scalar("gpu/memory_used_mb" + who, f[4] / (1 << 20), step);
    }
  }
  nlohmann::json rec = {{"kind", "resources"},
                        {"step", step},
                        {"rss_bytes", rss},
                        {"cpu_percent", cpu},
                        {"train_seconds", train_seconds},
                        {"time", std::time(nullptr)}};
  if (!gpu_util.empty()) {
    rec["gpu_util_percent"] = gpu_util;
    rec["gpu_memory_used_bytes"] = gpu_mem;
  }
  metrics_.write(rec);
}

void RunLog::evaluated(const EvalWindow& e) {
  if (!lead_) return;
  const auto& r = e.result;
  metrics_.write({{"kind", "eval"},
                  {"step", e.step},
                  {"epoch", e.epoch},
                  {"test_loss", r.loss()},
                  {"test_top1", r.top1()},
                  {"test_top5", r.top5()},
                  {"best_test_top1", e.best},
                  {"train_seconds", e.train_seconds},
                  {"time", std::time(nullptr)}});
  scalar("val/loss", r.loss(), e.step);
  scalar("val/top1", r.top1(), e.step);
  scalar("val/top5", r.top5(), e.step);
  if (tensorboard_) tensorboard_->flush();
  std::cout << "epoch " << e.epoch + 1 << " test: loss " << std::setprecision(4) << r.loss() << " top1 "
            << percent(r.top1()) << " top5 " << percent(r.top5()) << " (best " << percent(e.best) << ")" << std::endl;
}

void RunLog::epoch_ended(int64_t epoch, int64_t step, double seconds) {
  if (!lead_) return;
  metrics_.write({{"kind", "epoch"}, {"epoch", epoch}, {"step", step}, {"epoch_seconds", seconds}});
  if (tensorboard_) tensorboard_->flush();
}

void RunLog::record(const nlohmann::json& rec) {
  if (lead_) metrics_.write(rec);
}

}  // namespace cohort::record

#include "cohort/log/Report.h"

#include <cmath>
#include <ctime>
#include <fstream>
#include <iomanip>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cohort/log/Svg.h"
#include "cohort/util/AtomicFile.h"
#include "cohort/util/Error.h"

namespace cohort::log {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

json read_json(const fs::path& p) {
  std::ifstream in(p);
  if (!in) throw Error("cannot read " + p.string(), "report on a run directory of a finished `cohort train`");
  json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw Error(p.string() + " is not valid JSON", "was the run directory copied completely?");
  return j;
}

// metrics.jsonl: a line cut off by a crash is skipped, not fatal (the writer flushes whole lines).
std::vector<json> read_jsonl(const fs::path& p) {
  std::vector<json> out;
  std::ifstream in(p);
  std::string line;
  while (std::getline(in, line)) {
    json j = json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.is_object()) out.push_back(std::move(j));
  }
  return out;
}

double num(const json& j, const char* key, double fallback = NAN) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : fallback;
}

std::string fixed(double v, int digits) {
  if (!std::isfinite(v)) return "n/a";
  std::ostringstream os;
  os << std::fixed << std::setprecision(digits) << v;
  return os.str();
}
std::string pct(double v) { return std::isfinite(v) ? fixed(100 * v, 2) + "%" : "n/a"; }
std::string mib(double bytes) { return fixed(bytes / double(1 << 20), 0) + " MiB"; }
std::string str(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return "n/a";
  return it->is_string() ? it->get<std::string>() : it->dump();
}

// Runs before amp.precision=auto record it in the summary; their config holds a bool, later ones a string.
bool channels_last_of(const json& summary, const json& cfg) {
  if (summary.contains("channels_last")) return summary["channels_last"].get<bool>();
  const auto v = cfg.value("train.channels_last", json(false));
  return v.is_boolean() ? v.get<bool>() : v == "true";
}

json run_data(const fs::path& dir) {
  const json summary = read_json(dir / "summary.json");
  const json cfg = summary.value("config", json::object());
  const auto records = read_jsonl(dir / "metrics.jsonl");
  const double steps_per_epoch = num(summary, "steps_per_epoch", 1);

  json run;
  run["name"] = fs::absolute(dir).lexically_normal().filename().string();
  if (run["name"].get<std::string>().empty()) run["name"] = fs::absolute(dir).parent_path().filename().string();
  run["dir"] = fs::absolute(dir).lexically_normal().string();
  run["setup"] = {
      {"model", summary.value("model", "")},
      {"dataset", cfg.value("data.name", "")},
      {"world_size", summary.value("world_size", 0)},
      {"nnodes", summary.value("nnodes", 1)},
      {"launcher", summary.value("launcher", "")},
      {"strategy", summary.value("strategy", "")},
      {"backend", summary.value("backend", "")},
      {"compress", summary.value("compress", "none")},
      {"precision", summary.value("precision", "fp32")},
      {"channels_last", channels_last_of(summary, cfg)},
      {"global_batch", summary.value("global_batch", 0)},
      {"batch_per_worker", cfg.value("data.batch_size", 0)},
      {"grad_accum_steps", cfg.value("train.grad_accum_steps", 1)},
      {"threads_per_worker", summary.value("threads_per_worker", 0)},
      {"optimizer", "SGD lr " + str(cfg, "optim.lr") + ", momentum " + str(cfg, "optim.momentum") + ", weight decay " +
                        str(cfg, "optim.weight_decay") + ", schedule " + str(cfg, "sched.name")}};
  run["results"] = {{"best_test_accuracy", summary["best_test_accuracy"]},
                    {"test_accuracy", summary["test_accuracy"]},
                    {"train_seconds", summary["train_seconds"]},
                    {"images_per_second", summary["images_per_second"]},
                    {"steps", summary["steps"]},
                    {"epochs", summary["epochs"]},
                    {"achieved_tflops", summary.value("achieved_tflops", json())},
                    {"mfu", summary.value("mfu", json())},
                    {"peak_tflops_per_worker", summary.value("peak_tflops_per_worker", json())},
                    {"peak_source", summary.value("peak_source", json())}};

  // The swarm's own figures (dist.strategy=swarm or diloco): rounds, group sizes, failed rounds, bytes, peers.
  run["swarm"] = json::object();
  for (const auto& [key, value] : summary.items())
    if (key.rfind("swarm_", 0) == 0) run["swarm"][key.substr(6)] = value;
  if (!summary.value("stopped_by", json()).is_null()) run["results"]["stopped_by"] = summary["stopped_by"];

  std::map<int64_t, double> epoch_seconds;
  for (const auto& r : records)
    if (r.value("kind", "") == "epoch") epoch_seconds[r.value("epoch", int64_t{0})] = num(r, "epoch_seconds");
  json epochs = json::array(), train_curve = json::array(), eval_curve = json::array();
  for (const auto& r : records) {
    const std::string kind = r.value("kind", "");
    const double at_epoch = num(r, "step", 0) / steps_per_epoch;
    if (kind == "train") {
      train_curve.push_back({{"epoch", at_epoch},
                             {"train_seconds", num(r, "train_seconds")},
                             {"loss", num(r, "loss")},
                             {"top1", num(r, "top1")}});
    } else if (kind == "eval") {
      const int64_t e = r.value("epoch", int64_t{0});
      eval_curve.push_back({{"epoch", at_epoch},
                            {"train_seconds", num(r, "train_seconds")},
                            {"loss", num(r, "test_loss")},
                            {"top1", num(r, "test_top1")}});
      json row = {{"epoch", e + 1},
                  {"step", r["step"]},
                  {"test_loss", r["test_loss"]},
                  {"test_top1", r["test_top1"]},
                  {"test_top5", r["test_top5"]},
                  {"train_seconds", r["train_seconds"]}};
      row["epoch_seconds"] = epoch_seconds.count(e) ? json(epoch_seconds[e]) : json();
      epochs.push_back(row);
    }
  }
  run["epochs"] = epochs;
  run["curves"] = {{"train", train_curve}, {"eval", eval_curve}};
  if (summary.contains("resources")) {
    run["resources"] = summary["resources"];
  } else {  // runs from before the resource monitor: peak RSS only
    json res = json::array();
    int r = 0;
    for (const auto& b : summary.value("peak_rss_bytes", json::array()))
      res.push_back({{"rank", r++}, {"peak_rss_bytes", b}});
    run["resources"] = res;
  }
  run["gpu_monitor"] = summary.value("gpu_monitor", "not recorded");
  run["time_breakdown"] = summary.value("time_breakdown", json());  // runs before the phase clock have none
  run["batch_size"] = fs::exists(dir / "batch_size.json") ? read_json(dir / "batch_size.json") : json();
  return run;
}

LinePlot plot(const json& runs, const std::string& x, const std::string& y, const std::string& title,
              const std::string& x_label, const std::string& y_label, double y_scale) {
  LinePlot p{title, x_label, y_label, {}};
  const bool several = runs.size() > 1;
  for (const auto& run : runs)
    for (const char* which : {"train", "eval"}) {
      Series s{std::string(which == std::string("train") ? "train" : "test") +
                   (several ? " " + run["name"].get<std::string>() : ""),
               {}};
      for (const auto& pt : run["curves"][which])
        s.points.emplace_back(num(pt, x.c_str()), y_scale * num(pt, y.c_str()));
      if (!s.points.empty()) p.series.push_back(std::move(s));
    }
  return p;
}

// The phases of record/PhaseClock.h, in its order; a JSON object keeps its keys sorted instead.
const std::vector<std::string> kPhases = {"data",      "forward", "backward",   "comm",
                                          "optimizer", "eval",    "checkpoint", "other"};

StackedBars time_bars(const json& runs) {
  StackedBars p{"Where the time went (rank 0, share of the training loop's wall time)", kPhases, {}};
  for (const auto& run : runs) {
    const auto& t = run["time_breakdown"];
    if (t.is_null()) continue;
    std::vector<double> v;
    const json seconds = t.value("seconds", json::object());
    for (const auto& ph : kPhases) v.push_back(num(seconds, ph.c_str(), 0));
    p.bars.emplace_back(run["name"].get<std::string>(), v);
  }
  return p;
}

std::string time_section(const json& run) {
  std::ostringstream md;
  md << "### Where the time went\n\n";
  const auto& t = run["time_breakdown"];
  if (t.is_null()) return md.str() + "Not recorded (a run from before cohort measured its phases).\n\n";
  md << "Rank 0, " << fixed(num(t, "wall_seconds"), 1)
     << " s of training loop (comm: collectives the step waited "
        "for, not hidden behind backward):\n\n| phase | seconds | share |\n|---|---|---|\n";
  const json seconds = t.value("seconds", json::object()), share = t.value("share", json::object());
  for (const auto& ph : kPhases)
    md << "| " << ph << " | " << fixed(num(seconds, ph.c_str(), 0), 1) << " | " << pct(num(share, ph.c_str(), 0))
       << " |\n";
  return md.str() + "\n";
}

// The MFU row of a run's results: achieved FLOP/s over its workers' peak, with where the peak came from
// (summary.json's mfu; log/Peak.h). Runs from before MFU was counted, or on a GPU without a known peak,
// say why there is none.
std::string mfu_row(const json& r) {
  const double mfu = num(r, "mfu");
  if (!std::isfinite(mfu)) {
    const auto why = r.value("peak_source", json());
    return "| MFU | n/a" + (why.is_string() ? " (" + why.get<std::string>() + ")" : std::string()) + " |\n";
  }
  return "| MFU | " + pct(mfu) + " (" + fixed(num(r, "achieved_tflops"), 3) + " TFLOP/s over a peak of " +
         fixed(num(r, "peak_tflops_per_worker"), 3) + " per worker: " + r.value("peak_source", std::string()) + ") |\n";
}

// This peer's view of the swarm (empty for the other strategies).
std::string swarm_section(const json& run) {
  const auto& w = run["swarm"];
  if (w.empty()) return "";
  std::ostringstream md;
  md << "### Swarm (this peer)\n\n| | |\n|---|---|\n| rounds | " << w.value("rounds", json(0)) << " ("
     << w.value("failed_rounds", json(0)) << " failed) |\n| longest round | "
     << fixed(num(w, "longest_round_seconds", 0), 2) << " s |\n| mean group size | "
     << fixed(num(w, "mean_group_size", 0), 2) << " |\n| peers seen | " << w.value("peers_seen", json(0))
     << " |\n| bytes sent / received | " << mib(num(w, "bytes_sent", 0)) << " / " << mib(num(w, "bytes_received", 0))
     << " |\n| frames refused | " << w.value("frames_refused", json(0)) << " |\n\n";
  return md.str();
}

std::string markdown(const json& report) {
  std::ostringstream md;
  md << "# cohort run logbook\n\nGenerated " << report["generated"].get<std::string>() << " by `cohort report`"
     << " from " << report["runs"].size() << " run(s).\n\n";
  if (report.contains("comparison")) {
    md << "## Comparison\n\nSpeedup is the baseline's training time over the run's; throughput ratio is the run's "
          "images/s over the baseline's. Baseline: **"
       << report["runs"][0]["name"].get<std::string>() << "**.\n\n"
       << "| run | workers | nodes | strategy | precision | global batch | images/s | MFU | training time (s) | best "
          "top-1 | speedup | throughput ratio |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n";
    for (const auto& c : report["comparison"])
      md << "| " << c["name"].get<std::string>() << " | " << c["world_size"] << " | " << c["nnodes"] << " | "
         << c["strategy"].get<std::string>() << " | " << c["precision"].get<std::string>() << " | " << c["global_batch"]
         << " | " << fixed(num(c, "images_per_second"), 0) << " | " << pct(num(c, "mfu")) << " | "
         << fixed(num(c, "train_seconds"), 1) << " | " << pct(num(c, "best_test_accuracy")) << " | "
         << fixed(num(c, "speedup"), 2) << "x | " << fixed(num(c, "throughput_ratio"), 2) << "x |\n";
    md << "\n";
  }
  md << "## Plots\n\n![loss against epoch](loss_vs_epoch.svg)\n![loss against training time](loss_vs_time.svg)\n"
        "![top-1 accuracy against epoch](accuracy_vs_epoch.svg)\n"
        "![top-1 accuracy against training time](accuracy_vs_time.svg)\n"
        "![where the time went](time_breakdown.svg)\n\n";
  for (const auto& run : report["runs"]) {
    const auto& s = run["setup"];
    const auto& r = run["results"];
    md << "## Run " << run["name"].get<std::string>() << "\n\n`" << run["dir"].get<std::string>() << "`\n\n"
       << "### Setup\n\n| | |\n|---|---|\n"
       << "| model | " << s["model"].get<std::string>() << " |\n| dataset | " << s["dataset"].get<std::string>()
       << " |\n| workers | " << s["world_size"] << " on " << s["nnodes"] << " node(s), launcher "
       << s["launcher"].get<std::string>() << " |\n| strategy | " << s["strategy"].get<std::string>() << " over "
       << s["backend"].get<std::string>() << ", gradient compression " << s["compress"].get<std::string>()
       << " |\n| precision | " << s["precision"].get<std::string>()
       << (s.value("channels_last", false) ? ", channels-last" : "") << " |\n| batch | " << s["global_batch"]
       << " global (" << s["batch_per_worker"] << " per worker, gradient accumulation " << s["grad_accum_steps"]
       << ") |\n| threads per worker | " << s["threads_per_worker"] << " |\n| optimizer | "
       << s["optimizer"].get<std::string>() << " |\n\n"
       << "### Results\n\n| | |\n|---|---|\n| best test top-1 | " << pct(num(r, "best_test_accuracy"))
       << " |\n| final test top-1 | " << pct(num(r, "test_accuracy")) << " |\n| training time | "
       << fixed(num(r, "train_seconds"), 1) << " s (" << r["steps"] << " steps, " << fixed(num(r, "epochs"), 2)
       << " epochs) |\n| throughput | " << fixed(num(r, "images_per_second"), 0) << " images/s |\n"
       << mfu_row(r)
       << (r.contains("stopped_by") ? "| stopped by | " + r["stopped_by"].get<std::string>() + " |\n" : "") << "\n"
       << swarm_section(run)
       << "### Validation per epoch\n\n| epoch | step | test loss | top-1 | top-5 | epoch time (s) | training time "
          "so far (s) |\n|---|---|---|---|---|---|---|\n";
    for (const auto& e : run["epochs"])
      md << "| " << e["epoch"] << " | " << e["step"] << " | " << fixed(num(e, "test_loss"), 4) << " | "
         << pct(num(e, "test_top1")) << " | " << pct(num(e, "test_top5")) << " | " << fixed(num(e, "epoch_seconds"), 1)
         << " | " << fixed(num(e, "train_seconds"), 1) << " |\n";
    if (run["epochs"].empty()) md << "| (no evaluation recorded) | | | | | | |\n";
    md << "\n"
       << time_section(run)
       << "### Resources per rank\n\n| rank | peak RSS | mean CPU | GPU utilization mean / max | GPU memory peak |\n"
          "|---|---|---|---|---|\n";
    for (const auto& q : run["resources"]) {
      md << "| " << q["rank"] << " | " << mib(num(q, "peak_rss_bytes")) << " | " << fixed(num(q, "mean_cpu_percent"), 0)
         << "% | ";
      if (q.contains("gpu_mean_util_percent"))
        md << fixed(num(q, "gpu_mean_util_percent"), 0) << "% / " << fixed(num(q, "gpu_max_util_percent"), 0) << "% | "
           << mib(num(q, "gpu_peak_memory_used_bytes")) << " of " << mib(num(q, "gpu_memory_total_bytes")) << " |\n";
      else
        md << "no GPU | no GPU |\n";
    }
    md << "\nGPU monitor: " << run["gpu_monitor"].get<std::string>() << ".\n\n### Largest batch\n\n";
    if (run["batch_size"].is_null()) {
      md << "Not measured: run `cohort find-batch-size --run-dir " << run["dir"].get<std::string>()
         << "` with this run's config.\n\n";
    } else {
      const auto& b = run["batch_size"];
      md << "**" << b["batch_size"] << "** per worker within " << mib(num(b, "max_memory_bytes"))
         << " of peak RSS (limited by " << b.value("limited_by", "") << "), from " << b["trials"].size()
         << " trials of " << b["steps_per_trial"] << " steps:\n\n| batch | fits | peak RSS |\n|---|---|---|\n";
      for (const auto& t : b["trials"])
        md << "| " << t["batch_size"] << " | " << (t.value("fits", false) ? "yes" : "no: " + t.value("why", ""))
           << " | " << mib(num(t, "peak_rss_bytes")) << " |\n";
      md << "\n";
    }
    md << "### Config\n\n<details><summary>every key</summary>\n\n```\n";
    for (const auto& [k, v] : run["config"].items()) md << k << " = " << v.dump() << "\n";
    md << "```\n\n</details>\n\n";
  }
  return md.str();
}

}  // namespace

json build_report(const std::vector<fs::path>& run_dirs) {
  if (run_dirs.empty()) throw Error("cohort report needs at least one run directory", "cohort report runs/<name>");
  json report;
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  std::ostringstream when;
  when << std::put_time(&tm, "%Y-%m-%d %H:%M:%S");
  report["generated"] = when.str();
  report["runs"] = json::array();
  for (const auto& d : run_dirs) {
    json run = run_data(d);
    run["config"] = read_json(d / "summary.json").value("config", json::object());
    report["runs"].push_back(std::move(run));
  }
  if (run_dirs.size() > 1) {
    const auto& base = report["runs"][0]["results"];
    json cmp = json::array();
    for (const auto& run : report["runs"]) {
      const auto& s = run["setup"];
      const auto& r = run["results"];
      cmp.push_back({{"name", run["name"]},
                     {"world_size", s["world_size"]},
                     {"nnodes", s["nnodes"]},
                     {"strategy", s["strategy"]},
                     {"precision", s["precision"]},
                     {"global_batch", s["global_batch"]},
                     {"images_per_second", r["images_per_second"]},
                     {"mfu", r["mfu"]},
                     {"train_seconds", r["train_seconds"]},
                     {"best_test_accuracy", r["best_test_accuracy"]},
                     {"speedup", num(base, "train_seconds") / num(r, "train_seconds")},
                     {"throughput_ratio", num(r, "images_per_second") / num(base, "images_per_second")}});
    }
    report["comparison"] = cmp;
  }
  report["plots"] = {"loss_vs_epoch.svg", "loss_vs_time.svg", "accuracy_vs_epoch.svg", "accuracy_vs_time.svg",
                     "time_breakdown.svg"};
  return report;
}

fs::path write_report(const std::vector<fs::path>& run_dirs, const fs::path& out_dir) {
  const json report = build_report(run_dirs);
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) throw Error("cannot create " + out_dir.string() + ": " + ec.message(), "pass a writable --out");
  const json& runs = report["runs"];
  util::write_file_atomic(out_dir / "loss_vs_epoch.svg",
                          render_svg(plot(runs, "epoch", "loss", "Loss against epoch", "epoch", "loss", 1)));
  util::write_file_atomic(
      out_dir / "loss_vs_time.svg",
      render_svg(plot(runs, "train_seconds", "loss", "Loss against training time", "training time (s)", "loss", 1)));
  util::write_file_atomic(
      out_dir / "accuracy_vs_epoch.svg",
      render_svg(plot(runs, "epoch", "top1", "Top-1 accuracy against epoch", "epoch", "top-1 accuracy (%)", 100)));
  util::write_file_atomic(out_dir / "accuracy_vs_time.svg",
                          render_svg(plot(runs, "train_seconds", "top1", "Top-1 accuracy against training time",
                                          "training time (s)", "top-1 accuracy (%)", 100)));
  util::write_file_atomic(out_dir / "time_breakdown.svg", render_svg(time_bars(runs)));
  util::write_file_atomic(out_dir / "report.json", report.dump(2) + "\n");
  util::write_file_atomic(out_dir / "report.md", markdown(report));
  return out_dir / "report.md";
}

}  // namespace cohort::log

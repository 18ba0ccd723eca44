// `cohort report`: the run logbook the seed assignments assembled by hand, built from what a run leaves
// in its directory (summary.json, metrics.jsonl, batch_size.json from `cohort find-batch-size`):
// report.md (setup, results, per-epoch validation, per-rank memory, CPU and GPU use, the largest batch,
// the full config), report.json with the same numbers, and SVG plots of loss and accuracy against epoch
// and training time. Given several runs it adds a comparison table with speedups against the first.
//
//   auto md = cohort::log::write_report({"runs/one-node", "runs/two-nodes"}, "report");
//   // report/report.md, report/report.json, report/loss_vs_epoch.svg, ...
#pragma once

#include <filesystem>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace cohort::log {

// The report's data for the given runs (what report.json holds). Throws cohort::Error naming a run
// directory that has no summary.json (a run that did not finish) or unreadable files.
nlohmann::json build_report(const std::vector<std::filesystem::path>& run_dirs);

// Writes report.md, report.json and the plots into `out_dir`; returns the path of report.md.
std::filesystem::path write_report(const std::vector<std::filesystem::path>& run_dirs,
                                   const std::filesystem::path& out_dir);

}  // namespace cohort::log

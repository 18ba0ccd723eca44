#include "Report.h"

#include <filesystem>
#include <iostream>

#include "cohort/log/Report.h"
#include "cohort/record/StepTrace.h"
#include "cohort/util/AtomicFile.h"

namespace apps {

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

}  // namespace apps

// `cohort report`: the logbook of one run (report.md, report.json, SVG plots) or a comparison of several,
// and each run's step traces merged into one trace.json for Perfetto.
//
//   apps::ReportArgs report;
//   auto* reporter = apps::add_report_command(app, report);
//   app.parse(argc, argv);
//   if (*reporter) return apps::run_report(report);
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace apps {

struct ReportArgs {
  std::vector<std::string> run_dirs;
  std::string out;
};

CLI::App* add_report_command(CLI::App& app, ReportArgs& report);
int run_report(const ReportArgs& report);

}  // namespace apps

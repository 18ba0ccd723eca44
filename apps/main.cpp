// `cohort`: the command-line front end. Each command is in apps/commands/, with its options and what it
// runs; this file puts them together and runs the one given.
#include <iostream>
#include <string>

#include <torch/version.h>
#include <CLI/CLI.hpp>

#include "commands/Doctor.h"
#include "commands/Export.h"
#include "commands/FindBatchSize.h"
#include "commands/Report.h"
#include "commands/Swarm.h"
#include "commands/Train.h"

int main(int argc, char** argv) {
  CLI::App app{"cohort: data-parallel training of image classifiers across processes and machines"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("cohort " COHORT_VERSION " (LibTorch ") + TORCH_VERSION + ")");
  apps::TrainArgs train_args, eval_args, predict_args;
  apps::FindArgs find;
  apps::ReportArgs report;
  apps::ExportArgs exported;
  apps::SwarmCommands swarm_commands;
  apps::DoctorCommand doctor;
  auto* train = apps::add_train_command(app, train_args);
  auto* evaluator = apps::add_eval_command(app, eval_args);
  auto* predictor = apps::add_predict_command(app, predict_args);
  auto* finder = apps::add_find_batch_size_command(app, find);
  auto* reporter = apps::add_report_command(app, report);
  auto* exporter = apps::add_export_command(app, exported);
  apps::add_swarm_commands(app, swarm_commands);
  apps::add_doctor_command(app, doctor);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    if (*train) return apps::run_job(train_args, apps::Job::train);
    if (*evaluator) return apps::run_job(eval_args, apps::Job::eval);
    if (*predictor) return apps::run_predict_command(predict_args);
    if (*finder) return apps::run_find_batch_size(find);
    if (const int rc = apps::run_swarm_commands(swarm_commands); rc >= 0) return rc;
    if (const int rc = apps::run_doctor_command(doctor); rc >= 0) return rc;
    if (*exporter) return apps::run_export(exported);
    if (*reporter) return apps::run_report(report);
  } catch (const std::exception& e) {
    std::cerr << "cohort: error: " << apps::message_of(e) << std::endl;
    return 2;
  }
  return 0;
}

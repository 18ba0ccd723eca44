// `cohort export`: one full safetensors file of a checkpoint's weights, from a sharded zero1/zero2/fsdp
// save or an ordinary one.
//
//   apps::ExportArgs exported;
//   auto* exporter = apps::add_export_command(app, exported);
//   app.parse(argc, argv);
//   if (*exporter) return apps::run_export(exported);
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "cohort/checkpoint/Names.h"

namespace apps {

struct ExportArgs {
  std::string from, tag = cohort::checkpoint::names::kLast, out;
};

CLI::App* add_export_command(CLI::App& app, ExportArgs& e);
int run_export(const ExportArgs& e);

}  // namespace apps

#include "Export.h"

#include <filesystem>
#include <iostream>

#include "cohort/checkpoint/ShardedCheckpoint.h"
#include "cohort/checkpoint/Steps.h"

namespace apps {

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

}  // namespace apps

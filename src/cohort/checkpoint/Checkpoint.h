// Training checkpoints: model weights in a safetensors file with torchvision-style names
// (checkpoints/last.safetensors, checkpoints/best.safetensors) and, beside each, the training state
// needed to resume (last.state.safetensors: optimizer buffers plus step, epoch and config as metadata).
//
//   cohort::checkpoint::save(run_dir / "checkpoints", "last", *model, optimizer.state_dict(), state);
//   auto ck = cohort::checkpoint::load(cohort::checkpoint::resolve_resume_dir("runs/x"), "last");
//   cohort::checkpoint::load_weights(*model, ck.model, "runs/x/checkpoints/last.safetensors");
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <torch/nn/module.h>

#include "cohort/checkpoint/Safetensors.h"

namespace cohort::checkpoint {

// Note [Checkpoint format versions]
// Both files carry "cohort.format" and "cohort.version" metadata; versions only ever add fields, and a
// reader refuses a newer major version with a message saying so.
inline constexpr int kCheckpointVersion = 1;

struct TrainState {
  int64_t step = 0;   // optimizer steps done
  int64_t epoch = 0;  // epoch the next step belongs to
  double best_test_accuracy = -1;
  int64_t world_size = 1;
  std::string config_json;
  // fp16 loss scaling (amp::ScalerState), so a resumed run continues with the same scale. Written only
  // when loss_scale > 0; files without it load with loss_scale 0 ("none saved").
  double loss_scale = 0;
  int64_t loss_scale_growth_tracker = 0;
  int64_t skipped_steps = 0;
};

// The loss-scaler fields of `s` as a JSON object text, and back; both checkpoint kinds carry it.
std::string scaler_json(const TrainState& s);
void parse_scaler_json(const std::string& text, TrainState& s, const std::string& source);

struct Checkpoint {
  NamedTensors model;
  NamedTensors optimizer;
  TrainState state;
};

// Parameters and buffers in the module's own (torchvision-style) order.
NamedTensors model_state(const torch::nn::Module& module);

// Writes <dir>/<tag>.safetensors and <dir>/<tag>.state.safetensors, each atomically, the weights first.
void save(const std::filesystem::path& dir, const std::string& tag, const torch::nn::Module& module,
          const NamedTensors& optimizer_state, const TrainState& state);

// Throws CheckpointError when a file is missing or damaged or the two files are from different steps.
Checkpoint load(const std::filesystem::path& dir, const std::string& tag);

// The training state kept in a <tag>.state.safetensors file's metadata: checks its format and version and
// parses step, epoch, best accuracy, world size and config. load() uses it; the fuzzer feeds it files from
// from_safetensors_bytes. Throws CheckpointError naming `source` (the file) and the entry.
TrainState parse_train_state(const SafetensorsFile& file, const std::string& source);

// `cohort export`: the checkpoint's model weights as one ordinary safetensors file at `out` (a
// "cohort-model" file, as <tag>.safetensors is), whatever layout the checkpoint was saved in.
void export_weights(const Checkpoint& ck, const std::filesystem::path& out);

// Accepts a run directory or its checkpoints directory; returns the checkpoints directory.
std::filesystem::path resolve_resume_dir(const std::filesystem::path& path);

// Copies `tensors` into the module by name; a missing, unexpected or mismatched tensor is an error that
// lists them all. Names in `replaceable` (a classifier head) may differ in shape: they keep the module's
// own initialization and are returned, so fine-tuning from 1000 ImageNet classes to 10 works.
std::vector<std::string> load_weights(torch::nn::Module& module, const NamedTensors& tensors, const std::string& source,
                                      const std::vector<std::string>& replaceable = {});

}  // namespace cohort::checkpoint

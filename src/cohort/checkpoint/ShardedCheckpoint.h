// Sharded checkpoints, as ZeRO and FSDP write them: every rank saves its own slice, rank 0 a manifest
// that says how slices make whole parameters, and one commit marker once every slice is on disk (the step
// directory's COMMIT for "last", <tag>.commit for "best"). Loading reassembles full parameters and
// per-parameter optimizer state, so a run saved by 4 ranks resumes on 2 or 3 (or under ddp), and
// `cohort export` writes one ordinary safetensors file. A strategy hands over tensors and their layout
// (ShardedSave); the file names, tensor names and manifest are this file's business alone.
//
//   checkpoints/step-00000120/last.shard-00002-of-00004.safetensors   rank 2's slices (params, optimizer state)
//   checkpoints/step-00000120/last.manifest.json                      layout, step, config
//   checkpoints/step-00000120/COMMIT                                  written last (checkpoint/Steps.h)
//
//   cohort::checkpoint::save_sharded(dir, "last", strategy_save, state, *comm, CommitBy::kStepDirectory);
//   auto ck = cohort::checkpoint::load_any(dir, "last");   // sharded or not: full tensors either way
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "cohort/checkpoint/Checkpoint.h"
#include "cohort/comm/Communicator.h"

namespace cohort::checkpoint {

// Whether <dir>/<tag>.manifest.json exists (a sharded checkpoint, complete or not).
bool has_sharded(const std::filesystem::path& dir, const std::string& tag);

// How a sharded strategy's flat units hold whole parameters: identical on every rank. Each unit is one
// flat buffer of `padded` elements (`numel` of them parameters), cut into world_size slices of `shard`.
struct ShardLayout {
  struct Param {
    std::string name;
    std::vector<int64_t> shape;
    int64_t numel = 0;
    int64_t offset = 0;  // in the unit's flat buffer of shard x world_size elements
  };
  struct Unit {
    int64_t numel = 0, padded = 0;
    int64_t shard = 0;  // elements per rank
    std::vector<Param> params;
  };
  std::string strategy, optimizer;   // for people reading the manifest
  std::vector<std::string> kinds;    // optimizer state kinds ("momentum", "exp_avg"...), per unit below
  std::vector<std::string> buffers;  // names of the model's buffers, saved whole by rank 0
  std::vector<Unit> units;
};

// What one rank hands over for a sharded save: its slices, by unit, and the layout that reassembles them.
struct ShardedSave {
  ShardLayout layout;
  std::vector<at::Tensor> params;                        // [unit]: this rank's float32 slice of the weights
  std::map<std::string, std::vector<at::Tensor>> state;  // kind -> [unit]: the optimizer state's slices
  at::Tensor optimizer_step;                             // the optimizer-wide step (undefined: none)
  NamedTensors buffers;                                  // rank 0: the model's buffers, whole
};

// Who marks a sharded save complete: the step directory's COMMIT (checkpoint::commit_step, for "last"),
// or save_sharded itself with <tag>.commit (for "best", saved in place). One marker per save either way.
enum class CommitBy { kStepDirectory, kMarkerFile };

// Collective: every rank writes its shard file, rank 0 the manifest (and the marker, per `commit`).
void save_sharded(const std::filesystem::path& dir, const std::string& tag, const ShardedSave& save,
                  const TrainState& state, comm::Communicator& comm, CommitBy commit);

// Reassembles full tensors: model parameters and buffers by name, optimizer state as
// "<kind>.<param name>" plus "step". Throws CheckpointError naming a missing, damaged or mismatched
// shard, or an uncommitted save.
Checkpoint load_sharded(const std::filesystem::path& dir, const std::string& tag);

// The parts of <tag>.manifest.json that load_sharded reads: the training state and the layout.
struct ShardedManifest {
  TrainState state;
  int64_t version = 0;
  ShardLayout layout;
};

// More ranks than any cohort job has: a manifest that says more is damaged, and must not size per-rank tables.
inline constexpr int64_t kShardedMaxWorld = 1 << 16;

// Parses and checks a manifest's text (what load_sharded reads, and the fuzzer's entry point): every
// field present with its type, world_size in 1..kShardedMaxWorld, shapes and offsets non-negative and
// every parameter inside its unit. Throws CheckpointError naming `source` (the file).
ShardedManifest parse_manifest(std::string_view text, const std::string& source);

// The step a commit marker (<tag>.commit) records, or -1 when it records none. Throws CheckpointError
// naming `source` when the text is not a JSON object or "step" is not an integer.
int64_t parse_commit_step(std::string_view text, const std::string& source);

// load_sharded when <tag>.manifest.json exists, else checkpoint::load.
Checkpoint load_any(const std::filesystem::path& dir, const std::string& tag);

// Removes a sharded checkpoint's files for `tag` (an unsharded save replaces it).
void remove_sharded(const std::filesystem::path& dir, const std::string& tag);

}  // namespace cohort::checkpoint

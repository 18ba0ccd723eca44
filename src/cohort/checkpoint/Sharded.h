// Sharded checkpoints, as ZeRO and FSDP write them: every rank saves its own slice, rank 0 a manifest
// that says how slices make whole parameters, and last a commit marker once every slice is on disk.
// Loading reassembles full parameters and per-parameter optimizer state, so a run saved by 4 ranks
// resumes on 2 or 3 (or under ddp), and `cohort export` writes one ordinary safetensors file.
//
//   checkpoints/last.shard-00002-of-00004.safetensors   rank 2's slices (params, optimizer state)
//   checkpoints/last.manifest.json                      layout, step, config
//   checkpoints/last.commit                             written last: the checkpoint is complete
//
//   cohort::checkpoint::save_sharded(dir, "last", shard.tensors, shard.layout, state, *comm);   // collective
//   auto ck = cohort::checkpoint::load_any(dir, "last");   // sharded or not: full tensors either way
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "cohort/checkpoint/Checkpoint.h"
#include "cohort/comm/Communicator.h"

namespace cohort::checkpoint {

// Whether <dir>/<tag>.manifest.json exists (a sharded checkpoint, complete or not).
bool has_sharded(const std::filesystem::path& dir, const std::string& tag);

// Collective. `tensors` are this rank's; `layout` (identical on every rank) lists the units:
// {"units": [{"numel", "padded", "shard", "params": [{"name", "shape", "offset"}]}], "kinds": [...],
//  "buffers": [...], "world_size": N, ...}. Shard tensors are named "param.u<k>", "<kind>.u<k>", and on
// rank 0 "buffer.<name>"; "step" is an optimizer-wide scalar.
void save_sharded(const std::filesystem::path& dir, const std::string& tag, const NamedTensors& tensors,
                  const nlohmann::json& layout, const TrainState& state, Communicator& comm);

// Reassembles full tensors: model parameters and buffers by name, optimizer state as
// "<kind>.<param name>" plus "step". Throws CheckpointError naming a missing, damaged or mismatched
// shard, or an uncommitted save.
Checkpoint load_sharded(const std::filesystem::path& dir, const std::string& tag);

// The parts of <tag>.manifest.json that load_sharded reads: the training state, and how each unit's
// flat buffer (`shard` elements on each of world_size ranks) holds whole parameters.
struct ShardedManifest {
  struct Param {
    std::string name;
    std::vector<int64_t> shape;
    int64_t numel = 0;
    int64_t offset = 0;  // in the unit's flat buffer of shard x world_size elements
  };
  struct Unit {
    int64_t shard = 0;  // elements per rank
    std::vector<Param> params;
  };
  TrainState state;
  int64_t version = 0;
  std::vector<std::string> kinds;  // optimizer state kinds ("momentum", "exp_avg"...)
  std::vector<Unit> units;
  std::vector<std::string> buffers;
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

std::string shard_file_name(const std::string& tag, int rank, int world);

}  // namespace cohort::checkpoint

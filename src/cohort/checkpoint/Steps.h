// Crash-safe "last" checkpoints: every save goes to a fresh step directory, a commit marker is written
// last, and loading takes the newest directory that is committed and reads back intact, naming and
// skipping any that is not. A kill -9 at any moment of a save leaves the previous checkpoint usable.
//
//   checkpoints/step-00000120/last.safetensors, last.state.safetensors (or shards + manifest)
//   checkpoints/step-00000120/COMMIT        written last: {"step", "files": [{"name", "bytes"}]}
//   checkpoints/last.safetensors -> step-00000120/last.safetensors   (links for people and tools)
//
//   auto dir = cohort::checkpoint::new_step_dir(ck_dir, step);       // identical on every rank
//   cohort::checkpoint::save(dir, "last", ...);  cohort::checkpoint::commit_step(ck_dir, dir, 2);
//   auto found = cohort::checkpoint::load_latest(ck_dir);           // found.skipped says what was broken
//
// Retention (ckpt.keep_last) removes older step directories only after a newer one is committed.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cohort/checkpoint/Checkpoint.h"
#include "cohort/checkpoint/Names.h"

namespace cohort::checkpoint {

struct StepDir {
  std::filesystem::path path;
  int64_t step = 0;
  int64_t serial = 0;  // a second save of the same step goes to step-N.1, and so on
};

// Every step-* directory under `ck_dir`, newest first (committed or not).
std::vector<StepDir> list_step_dirs(const std::filesystem::path& ck_dir);

// The directory the next save of `step` goes to: step-<8 digits>, or step-<8 digits>.<k> when that
// exists already. A pure function of what is on disk, so every rank of a sharded save picks the same one
// as long as they look before anyone creates it.
std::filesystem::path new_step_dir(const std::filesystem::path& ck_dir, int64_t step);

// Rank 0, after every file of the save is durably written: writes the COMMIT marker (atomically, listing
// each file and its size), points the links under `ck_dir` at the new files, then removes all but the
// newest `keep_last` committed step directories and any uncommitted one older than this save.
void commit_step(const std::filesystem::path& ck_dir, const std::filesystem::path& step_dir, int64_t step,
                 int keep_last);

// A COMMIT marker's text: the step and each file with its size. Checks types and that every name is a
// plain file name (no '/', not "." or ".."), so a damaged marker can never point outside its directory.
// Throws CheckpointError naming `source`. The fuzzer's entry point (fuzz/fuzz_manifest.cpp).
struct CommitMarker {
  int64_t step = 0;
  std::vector<std::pair<std::string, uint64_t>> files;
};
CommitMarker parse_commit_marker(std::string_view text, const std::string& source);

// Why `step_dir` cannot be resumed from ("" when it looks complete): no marker, a listed file missing
// or of another size. Cheap; does not read the tensors.
std::string step_dir_problem(const std::filesystem::path& step_dir);

// Whether `ck_dir` holds anything load_latest could try: a committed step directory, or the flat files
// of an older cohort.
bool has_resumable(const std::filesystem::path& ck_dir);

struct Latest {
  Checkpoint checkpoint;
  std::filesystem::path dir;         // where it was loaded from
  std::vector<std::string> skipped;  // "step-00000130: no COMMIT marker (the save was cut off)"
};

// The newest committed step directory that loads (checksums included); each one skipped on the way is
// named with its reason. Falls back to the flat <ck_dir>/last.* files of runs saved before step
// directories. Throws CheckpointError listing every candidate and its problem when none loads.
Latest load_latest(const std::filesystem::path& ck_dir);

// What `cohort eval` and `cohort predict` load: the model weights of `path`, a weights file (.safetensors)
// or a run directory (or its checkpoints/): its best checkpoint when there is one, else the newest
// committed step; sharded ones are reassembled. `source` names what was read, for errors.
struct ModelWeights {
  NamedTensors tensors;
  std::string source;
};
ModelWeights load_model_weights(const std::filesystem::path& path);

}  // namespace cohort::checkpoint

// Every name in cohort's checkpoint format, in one place: the tags, the files a tag is saved as, the
// commit marker, the prefixes that share a training-state file, and the tensor names inside a shard.
// Code elsewhere asks for a name here rather than spelling it, so the format has one owner.
//
//   dir / cohort::checkpoint::names::weights_file(cohort::checkpoint::names::kBest)  // best.safetensors
//   cohort::checkpoint::names::shard_file("last", 2, 4)   // last.shard-00002-of-00004.safetensors
#pragma once

#include <string>

namespace cohort::checkpoint::names {

// The run's checkpoints live in <run dir>/<kCheckpointsDir>.
inline const std::string kCheckpointsDir = "checkpoints";
// "last" is the newest resumable state (in step directories, checkpoint/Steps.h); "best" the state of
// the best test accuracy so far (beside them, replaced in place).
inline const std::string kLast = "last";
inline const std::string kBest = "best";
// A step directory's one commit marker, written last (checkpoint/Steps.h).
inline const std::string kStepCommit = "COMMIT";
inline const std::string kStepDirPrefix = "step-";

// The files of one tag: the weights and training state of an unsharded save; the manifest, one file per
// rank and (outside step directories) the commit marker of a sharded one; what `cohort export` writes.
std::string weights_file(const std::string& tag);                     // <tag>.safetensors
std::string state_file(const std::string& tag);                       // <tag>.state.safetensors
std::string manifest_file(const std::string& tag);                    // <tag>.manifest.json
std::string commit_file(const std::string& tag);                      // <tag>.commit
std::string shard_file(const std::string& tag, int rank, int world);  // <tag>.shard-RRRRR-of-WWWWW.safetensors
std::string shard_file_prefix(const std::string& tag);                // <tag>.shard-
std::string export_file(const std::string& tag);                      // <tag>.full.safetensors

// A training-state file holds the optimizer's per-parameter state under its own names ("<kind>.<param>",
// and "step"), fp16-master's float32 weights, a strategy's resume state and airbench's lookahead average.
inline const std::string kMasterPrefix = "master.";
inline const std::string kStrategyPrefix = "strategy.";
inline const std::string kLookaheadPrefix = "lookahead.";
inline const std::string kOptimizerStep = "step";

// Inside a shard file: unit u's slice of the flat weights and of each optimizer state kind, rank 0's
// full buffers, and the optimizer-wide step.
std::string shard_param(size_t unit);                           // param.u<k>
std::string shard_state(const std::string& kind, size_t unit);  // <kind>.u<k>
inline const std::string kShardBufferPrefix = "buffer.";
inline const std::string kShardParamKind = "param";  // shard_param(u) == shard_state(kShardParamKind, u)

}  // namespace cohort::checkpoint::names

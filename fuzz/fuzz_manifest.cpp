// libFuzzer harness: a sharded checkpoint's <tag>.manifest.json and <tag>.commit marker, the JSON that
// load_sharded trusts to size per-rank tables and cut parameters out of flat buffers, and a step
// directory's COMMIT marker (checkpoint/Steps.h), which names the files to check. Every input goes to all
// three parsers; each must reject bad input with CheckpointError.
#include <cstddef>
#include <cstdint>

#include "FuzzSupport.h"
#include "cohort/checkpoint/ShardedCheckpoint.h"
#include "cohort/checkpoint/Steps.h"
#include "cohort/util/Error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto text = cohort::fuzz::as_text(data, size);
  try {
    cohort::checkpoint::parse_manifest(text, "fuzz.manifest.json");
  } catch (const cohort::CheckpointError& e) {
    cohort::fuzz::rejected(e);
  }
  try {
    cohort::checkpoint::parse_commit_step(text, "fuzz.commit");
  } catch (const cohort::CheckpointError& e) {
    cohort::fuzz::rejected(e);
  }
  try {
    cohort::checkpoint::parse_commit_marker(text, "fuzz/COMMIT");
  } catch (const cohort::CheckpointError& e) {
    cohort::fuzz::rejected(e);
  }
  return 0;
}

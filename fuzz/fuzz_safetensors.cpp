// libFuzzer harness: safetensors files (weights, checkpoints, shards) from untrusted bytes.
// from_safetensors_bytes must reject any input with a cohort::CheckpointError; a crash, a sanitizer
// report or an exception of another type is a bug in the reader.
#include <cstddef>
#include <cstdint>

#include "FuzzSupport.h"
#include "cohort/checkpoint/Safetensors.h"
#include "cohort/util/Error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto bytes = cohort::fuzz::as_text(data, size);
  try {
    cohort::checkpoint::from_safetensors_bytes(bytes, "fuzz.safetensors");
  } catch (const cohort::CheckpointError& e) {
    cohort::fuzz::rejected(e);
  }
  return 0;
}

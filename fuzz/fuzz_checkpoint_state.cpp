// libFuzzer harness: the training state file (<tag>.state.safetensors), whose metadata holds step,
// epoch, best accuracy, world size and config. The bytes go through the safetensors reader and then
// parse_train_state, as checkpoint::load reads them; both must reject bad input with CheckpointError.
#include <cstddef>
#include <cstdint>

#include "FuzzSupport.h"
#include "cohort/checkpoint/Checkpoint.h"
#include "cohort/util/Error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto bytes = cohort::fuzz::as_text(data, size);
  try {
    const auto file = cohort::checkpoint::from_safetensors_bytes(bytes, "fuzz.state.safetensors");
    cohort::checkpoint::parse_train_state(file, "fuzz.state.safetensors");
  } catch (const cohort::CheckpointError& e) {
    cohort::fuzz::rejected(e);
  }
  return 0;
}

// libFuzzer harness: IDX files (MNIST, Fashion-MNIST), raw or gzip-compressed. read_idx_bytes must
// reject bad input with cohort::DataError and never allocate more than the input can hold.
#include <cstddef>
#include <cstdint>

#include "FuzzSupport.h"
#include "cohort/data/Idx.h"
#include "cohort/util/Error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto bytes = cohort::fuzz::as_text(data, size);
  try {
    cohort::data::read_idx_bytes(bytes, "fuzz-idx");
  } catch (const cohort::DataError& e) {
    cohort::fuzz::rejected(e);
  }
  return 0;
}

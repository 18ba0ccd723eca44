// libFuzzer harness: CIFAR-10 binary batch files (label byte + 3072 pixel bytes per record).
// read_cifar10_bytes must reject bad input with cohort::DataError.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "FuzzSupport.h"
#include "cohort/data/Cifar10.h"
#include "cohort/util/Error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto bytes = cohort::fuzz::as_text(data, size);
  std::vector<uint8_t> images;
  std::vector<int64_t> labels;
  try {
    cohort::data::read_cifar10_bytes(bytes, "fuzz.bin", images, labels);
  } catch (const cohort::DataError& e) {
    cohort::fuzz::rejected(e);
  }
  return 0;
}

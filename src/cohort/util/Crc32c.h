// CRC-32C (Castagnoli), incremental: TensorBoard's TFRecord framing uses it, and so do cohort's
// checkpoint files, whose bytes are checked on load. SSE4.2's crc32 instruction where the CPU has it
// (about 10x the table's speed: a 350 MB checkpoint in a fraction of a second), else a table.
//
//   uint32_t c = cohort::util::crc32c("123456789", 9);       // 0xE3069283
//   cohort::util::Crc32c acc;  acc.update(a, na);  acc.update(b, nb);  acc.value() == crc32c(a+b)
#pragma once

#include <cstddef>
#include <cstdint>

namespace cohort::util {

class Crc32c {
 public:
  void update(const void* data, size_t n);
  uint32_t value() const { return state_ ^ 0xFFFFFFFFu; }

 private:
  uint32_t state_ = 0xFFFFFFFFu;
};

uint32_t crc32c(const void* data, size_t n);

}  // namespace cohort::util

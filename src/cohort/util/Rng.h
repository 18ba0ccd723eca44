// Counter-based random numbers: a value is a pure function of (seed, stream, counter), never of how many
// numbers were drawn before. That makes augmentation and shuffling identical on every rank, independent
// of the world size, and resumable from any step without saving generator state.
//
//   cohort::util::Rng rng(cohort::util::mix_seed(seed, epoch, sample_index));
//   bool flip = rng.next_u64() & 1;  int dx = rng.uniform_int(5) - 2;
//
// We use splitmix64 rather than std::mt19937 + std::uniform_int_distribution because the standard
// distributions are implementation-defined: two builds (Debian here, pip LibTorch on the GPU machine)
// must draw the same numbers.
#pragma once

#include <cstdint>

namespace cohort::util {

constexpr uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Hashes any number of integers into one seed.
constexpr uint64_t mix_seed(uint64_t a) { return splitmix64(a); }
template <typename... Rest>
constexpr uint64_t mix_seed(uint64_t a, uint64_t b, Rest... rest) {
  return mix_seed(splitmix64(a) ^ (b + 0x632BE59BD9B4E019ull), static_cast<uint64_t>(rest)...);
}

class Rng {
 public:
  explicit constexpr Rng(uint64_t seed) : state_(seed) {}
  constexpr uint64_t next_u64() {
    state_ += 0x9E3779B97F4A7C15ull;
    return splitmix64(state_);
  }
  // Uniform in [0, n) without modulo bias (Lemire's rejection on the 128-bit product).
  uint64_t uniform_int(uint64_t n) {
    if (n == 0) return 0;
    for (;;) {
      const unsigned __int128 m = static_cast<unsigned __int128>(next_u64()) * n;
      const uint64_t low = static_cast<uint64_t>(m);
      // Accept unless `low` falls in the short biased range [0, 2^64 mod n).
      if (low >= (-n) % n) return static_cast<uint64_t>(m >> 64);
    }
  }
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }

 private:
  uint64_t state_;
};

}  // namespace cohort::util

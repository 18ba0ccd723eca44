// Helpers shared by the libFuzzer harnesses in this folder: the input as text, and an optional report of
// why the parser refused it.
//
//   try { parse(cohort::fuzz::as_text(data, size)); }
//   catch (const cohort::DataError& e) { cohort::fuzz::rejected(e); }
//
// Run a harness on files (not a folder) with COHORT_FUZZ_VERBOSE=1 to see each one's error message:
// a seed should print nothing, a regression input the message of the check that now stops it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string_view>

namespace cohort::fuzz {

inline std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

inline void rejected(const std::exception& e) {
  // Looked up once: getenv on every one of millions of inputs would show in the execution rate.
  static const bool verbose = std::getenv("COHORT_FUZZ_VERBOSE") != nullptr;
  if (verbose) std::fprintf(stderr, "rejected: %s\n", e.what());
}

}  // namespace cohort::fuzz

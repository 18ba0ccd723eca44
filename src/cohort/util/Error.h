// Typed errors for everything a user can get wrong, and an internal assert for what only a bug can break.
//
// A user error says what was wrong, the value, and a hint for the fix; the trainer prefixes the rank:
//
//   throw cohort::ConfigError("data.batch_size must be positive, got -3", "pass data.batch_size=128");
//
// Catch `cohort::Error` at the top of a program to print `what()` and `hint()`.
#pragma once

#include <stdexcept>
#include <string>

namespace cohort {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what, std::string hint = {}) : std::runtime_error(what), hint_(std::move(hint)) {}
  const std::string& hint() const noexcept { return hint_; }
  // "what\n---> HINT: hint", the form every top-level handler prints.
  std::string describe() const {
    return hint_.empty() ? std::string(what()) : std::string(what()) + "\n---> HINT: " + hint_;
  }

 private:
  std::string hint_;
};

// A key or value in a config file or on the command line.
class ConfigError : public Error {
  using Error::Error;
};
// A dataset file that is missing, truncated or malformed.
class DataError : public Error {
  using Error::Error;
};
// A checkpoint or weights file that cannot be read or written.
class CheckpointError : public Error {
  using Error::Error;
};
// Rendezvous, a collective, a timeout or a mismatch between ranks.
class CommError : public Error {
  using Error::Error;
};
// The launcher: a worker that failed, a port in use, bad launch flags.
class LaunchError : public Error {
  using Error::Error;
};

namespace detail {
[[noreturn]] void internal_assert_fail(const char* cond, const char* file, int line, const std::string& msg);
}  // namespace detail

}  // namespace cohort

// Invariants only a bug in cohort can break. Always on: the checks are cheap next to tensor work.
#define COHORT_ASSERT(cond, msg)                                                           \
  do {                                                                                     \
    if (!(cond)) ::cohort::detail::internal_assert_fail(#cond, __FILE__, __LINE__, (msg)); \
  } while (0)

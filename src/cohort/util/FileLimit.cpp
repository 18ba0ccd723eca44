#include "cohort/util/FileLimit.h"

#include <sys/resource.h>

namespace cohort::util {

uint64_t raise_open_file_limit() {
  constexpr rlim_t kUnlimited = rlim_t{1} << 20;
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) != 0) return 1024;
  if (r.rlim_cur != RLIM_INFINITY && (r.rlim_max == RLIM_INFINITY || r.rlim_cur < r.rlim_max)) {
    rlimit raised = r;
    raised.rlim_cur = r.rlim_max == RLIM_INFINITY ? kUnlimited : r.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) r = raised;
  }
  return r.rlim_cur == RLIM_INFINITY ? kUnlimited : static_cast<uint64_t>(r.rlim_cur);
}

std::optional<std::string> open_file_shortfall(int rank, int world_size, bool hosts_store, uint64_t limit) {
  // A socket for each other rank, the store's connections where it lives (one or two a rank: the store
  // keeps half the process's limit for them), and 64 for the rest: libraries, data, checkpoints, logs.
  const uint64_t peers = world_size > 1 ? static_cast<uint64_t>(world_size - 1) : 0;
  const uint64_t need = peers + (hosts_store ? 2 * static_cast<uint64_t>(world_size) : 0) + 64;
  if (world_size <= 1 || limit >= need) return std::nullopt;
  return "rank " + std::to_string(rank) + " of " + std::to_string(world_size) + " needs about " + std::to_string(need) +
         " open files (a socket for each other rank" +
         (hosts_store ? std::string(", and the store's connections") : std::string()) +
         "), but this process may open " + std::to_string(limit) + " (the hard limit of ulimit -n)";
}

}  // namespace cohort::util

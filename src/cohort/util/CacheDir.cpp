#include "cohort/util/CacheDir.h"

#include <cstdlib>

namespace cohort::util {

std::filesystem::path cache_dir() {
  if (const char* dir = std::getenv("COHORT_CACHE"); dir && *dir) return dir;
  const char* home = std::getenv("HOME");
  return std::filesystem::path(home && *home ? home : "/tmp") / ".cache" / "cohort";
}

}  // namespace cohort::util

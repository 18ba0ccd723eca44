#include "cohort/util/Memory.h"

#include <malloc.h>

#include <fstream>
#include <sstream>
#include <string>

namespace cohort::util {
namespace {

int64_t status_kib(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const std::string prefix = std::string(field) + ":";
  while (std::getline(in, line)) {
    if (line.rfind(prefix, 0) == 0) {
      std::istringstream is(line.substr(prefix.size()));
      int64_t kib = 0;
      is >> kib;
      return kib;
    }
  }
  return 0;
}

}  // namespace

int64_t peak_rss_bytes() { return status_kib("VmHWM") * 1024; }
int64_t current_rss_bytes() { return status_kib("VmRSS") * 1024; }

void retain_freed_memory() {
  // Blocks up to 256 MiB come from the heap, and up to 1 GiB of free heap top stays mapped. glibc's
  // own dynamic threshold stops at 32 MiB and only rises after a large block is freed once.
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

}  // namespace cohort::util

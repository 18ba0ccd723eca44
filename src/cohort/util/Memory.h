// Process memory: what a worker has used (for summaries and the logbook) and how freed memory is kept.
//
//   cohort::util::retain_freed_memory();          // once, before training
//   int64_t peak = cohort::util::peak_rss_bytes();
#pragma once

#include <cstdint>

namespace cohort::util {

// Peak and current resident set size of this process, from /proc/self/status (0 where unreadable).
int64_t peak_rss_bytes();
int64_t current_rss_bytes();

// Every training step allocates and frees the same activation and gradient tensors. glibc serves large
// blocks with mmap and returns them (and the top of the heap) to the kernel on free, so each step pays
// page faults to zero fresh pages again (about 10% of a CPU step on the default job, seen with perf).
// Raising the mmap and trim thresholds keeps freed blocks for reuse, as PyTorch's CUDA caching
// allocator does on GPUs. Call once per process before training; it costs resident memory, not speed.
void retain_freed_memory();

}  // namespace cohort::util

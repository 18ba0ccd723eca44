// Process memory helpers: RSS readings, and that retain_freed_memory really keeps large blocks in the
// heap instead of mapping and unmapping them on every allocation.
#include <gtest/gtest.h>

#include <malloc.h>

#include <cstdlib>
#include <cstring>

#include "cohort/util/Memory.h"

TEST(Memory, RssIsReadFromProc) {
  EXPECT_GT(cohort::util::current_rss_bytes(), 0);
  EXPECT_GE(cohort::util::peak_rss_bytes(), cohort::util::current_rss_bytes());
}

TEST(Memory, RetainedBlocksComeFromTheHeapNotFreshMappings) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "a sanitizer replaces glibc's malloc, whose thresholds this test checks";
#endif
  // glibc's default serves a block this large with its own mmap (counted in hblks) and unmaps it on
  // free; after retain_freed_memory it comes from the heap, and freeing it keeps the pages.
  constexpr size_t kBlock = 48u << 20;  // above glibc's largest dynamic mmap threshold (32 MiB)
  const int before = mallinfo2().hblks;
  void* fresh = std::malloc(kBlock);
  ASSERT_NE(fresh, nullptr);
  EXPECT_EQ(mallinfo2().hblks, before + 1) << "without retaining, glibc maps a 48 MiB block by itself";
  std::free(fresh);

  cohort::util::retain_freed_memory();
  void* kept = std::malloc(kBlock);
  ASSERT_NE(kept, nullptr);
  std::memset(kept, 1, kBlock);
  EXPECT_EQ(mallinfo2().hblks, before) << "after retain_freed_memory the block comes from the heap";
  std::free(kept);
  EXPECT_GE(mallinfo2().fordblks, kBlock) << "and freeing it keeps it in the heap for the next step";
}

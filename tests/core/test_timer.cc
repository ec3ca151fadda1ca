// median (core/timer.h) and the process's resident memory (core/process_memory.h).
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstring>
#include <vector>

#include "seqpar/core/process_memory.h"
#include "seqpar/core/timer.h"

namespace seqpar {

TEST(Median, OddEvenAndEmpty) {
  EXPECT_EQ(median({}), 0.0);
  EXPECT_EQ(median({3.0}), 3.0);
  EXPECT_EQ(median({5.0, 1.0, 3.0}), 3.0);
  EXPECT_EQ(median({4.0, 1.0, 3.0, 2.0}), 2.5);  // the mean of the middle two
  EXPECT_EQ(median({9.0, 9.0, 1.0, 1.0, 5.0, 7.0}), 6.0);
}

TEST(ProcessMemory, PeakStaysAfterTheMemoryIsFreed) {
  const int64_t now = resident_bytes();
  const int64_t before = peak_resident_bytes();
  EXPECT_GT(now, 0);
  EXPECT_GE(before, now);
  {  // 64 MiB beyond the peak so far, touched, then returned to the system: a mapping of its own
     // (mmap, not the heap, whose freed blocks a sanitizer's allocator keeps resident)
    const size_t bytes = static_cast<size_t>(before - now) + (64 << 20);
    void* block = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(block, MAP_FAILED);
    std::memset(block, 1, bytes);
    EXPECT_EQ(static_cast<const char*>(block)[bytes / 2], 1);
    ::munmap(block, bytes);
  }
  const int64_t peak = peak_resident_bytes();
  EXPECT_GE(peak, before + (48 << 20));
  EXPECT_LE(resident_bytes(), peak - (32 << 20));  // the peak, not what is resident now
}

}  // namespace seqpar

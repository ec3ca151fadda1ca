// block_cache (core/block_cache.h): size classes, reuse of a given block by the next take of its
// class, the limit (oldest blocks freed first, a block above it never held), and Tensor storage
// that comes back zero-filled however the reused block was left; storage from 2 MiB on a 2 MiB
// boundary with its whole 2 MiB pages advised as huge pages (their mapping's VmFlags in
// /proc/self/smaps say "hg"), not with the advice off, and in auto mode back to small pages
// ("nh") after a slow first touch.
#include <gtest/gtest.h>
#include <malloc.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "seqpar/core/block_cache.h"
#include "seqpar/core/tensor.h"

namespace seqpar {
namespace {

namespace bc = block_cache;

// Each test starts from an empty cache of a known limit and leaves the default behind.
class BlockCache : public ::testing::Test {
 protected:
  void SetUp() override {
    saved_ = bc::limit_bytes();
    bc::set_limit_bytes(0);
    bc::set_limit_bytes(size_t{64} << 20);
  }
  void TearDown() override { bc::set_limit_bytes(saved_); }
  size_t saved_ = 0;
};

TEST_F(BlockCache, SizeClasses) {
  EXPECT_EQ(bc::class_bytes(0), 64u);
  EXPECT_EQ(bc::class_bytes(1), 64u);
  EXPECT_EQ(bc::class_bytes(65), 128u);
  EXPECT_EQ(bc::class_bytes(bc::kMinBytes - 1), bc::kMinBytes);
  EXPECT_EQ(bc::class_bytes(bc::kMinBytes), bc::kMinBytes);
  // From kMinBytes: eighths of the power of two below.
  EXPECT_EQ(bc::class_bytes(bc::kMinBytes + 1), bc::kMinBytes + bc::kMinBytes / 8);
  EXPECT_EQ(bc::class_bytes(size_t{3} << 20), size_t{3} << 20);
  EXPECT_EQ(bc::class_bytes((size_t{3} << 20) + 1), (size_t{3} << 20) + (size_t{1} << 18));
  size_t last = 0;
  for (size_t b = 1; b < (size_t{64} << 20); b = b * 9 / 8 + 13) {
    const size_t c = bc::class_bytes(b);
    ASSERT_GE(c, b);
    ASSERT_EQ(c % 64, 0u) << b;
    ASSERT_LE(c, b < bc::kMinBytes ? b + 63 : b + b / 8) << b;
    ASSERT_GE(c, last) << b;
    last = c;
  }
}

TEST_F(BlockCache, AGivenBlockServesTheNextTakeOfItsClass) {
  void* a = bc::take(size_t{1} << 20);
  bc::give(a, size_t{1} << 20);
  EXPECT_EQ(bc::cached_bytes(), size_t{1} << 20);
  // Another size of the same class gets it; another class does not.
  void* b = bc::take((size_t{1} << 20) - 1000);
  EXPECT_EQ(b, a);
  EXPECT_EQ(bc::cached_bytes(), 0u);
  bc::give(b, (size_t{1} << 20) - 1000);
  void* c = bc::take(size_t{2} << 20);
  EXPECT_NE(c, a);
  EXPECT_EQ(bc::cached_bytes(), size_t{1} << 20);
  bc::give(c, size_t{2} << 20);
  EXPECT_EQ(bc::cached_bytes(), size_t{3} << 20);
  // Small blocks are never held.
  void* s = bc::take(1000);
  bc::give(s, 1000);
  EXPECT_EQ(bc::cached_bytes(), size_t{3} << 20);
}

TEST_F(BlockCache, ReleaseFreesEveryBlockAndKeepsTheLimit) {
  const size_t mb = size_t{1} << 20;
  void* a = bc::take(mb);
  void* b = bc::take(2 * mb);
  bc::give(a, mb);
  bc::give(b, 2 * mb);
  EXPECT_EQ(bc::cached_bytes(), 3 * mb);
  bc::release();
  EXPECT_EQ(bc::cached_bytes(), 0u);
  EXPECT_EQ(bc::limit_bytes(), size_t{64} << 20);
  bc::give(bc::take(mb), mb);
  EXPECT_EQ(bc::cached_bytes(), mb);
}

TEST_F(BlockCache, TheLimitFreesTheOldestFirst) {
  bc::set_limit_bytes(size_t{3} << 20);
  const size_t mb = size_t{1} << 20;
  std::vector<void*> p;
  for (int i = 0; i < 4; ++i) p.push_back(bc::take(mb));
  for (void* q : p) bc::give(q, mb);
  EXPECT_EQ(bc::cached_bytes(), 3 * mb);
  // The three given last are held, the newest handed out first.
  EXPECT_EQ(bc::take(mb), p[3]);
  EXPECT_EQ(bc::take(mb), p[2]);
  EXPECT_EQ(bc::take(mb), p[1]);
  EXPECT_EQ(bc::cached_bytes(), 0u);
  for (int i = 1; i < 4; ++i) bc::give(p[i], mb);
  // A block above the limit is freed, not held, and leaves the others.
  void* big = bc::take(4 * mb);
  bc::give(big, 4 * mb);
  EXPECT_EQ(bc::cached_bytes(), 3 * mb);
  bc::set_limit_bytes(mb);
  EXPECT_EQ(bc::cached_bytes(), mb);
  bc::set_limit_bytes(0);
  EXPECT_EQ(bc::cached_bytes(), 0u);
  void* none = bc::take(mb);
  bc::give(none, mb);
  EXPECT_EQ(bc::cached_bytes(), 0u);
}

TEST_F(BlockCache, TensorsOnReusedStorageAreZeroFilled) {
  const int64_t n = (int64_t{1} << 18) + 3;  // about 1 MiB of fp32, not a class boundary
  const void* first = nullptr;
  {
    Tensor t({n});
    first = t.raw();
    t.fill(5.0f);
  }
  Tensor u({n - 2});          // the same size class
  EXPECT_EQ(u.raw(), first);  // the same block, written with 5s before
  for (int64_t i = 0; i < u.numel(); ++i) ASSERT_EQ(u.data<float>()[i], 0.0f) << i;
  // The capacity is what the tensor asked for (whole 64 bytes), not its block's class.
  EXPECT_EQ(u.capacity_bytes(), (u.nbytes() + 63) / 64 * 64);
}

// The VmFlags of the mapping of this process that holds address p ("" if none does).
std::string vm_flags_at(const void* p) {
  const auto at = reinterpret_cast<uintptr_t>(p);
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> lo >> dash >> hi && dash == '-' &&
        line.find(' ') != std::string::npos && line.find(':') > line.find(' ')) {
      inside = at >= lo && at < hi;
      continue;
    }
    if (inside && line.rfind("VmFlags:", 0) == 0) return line.substr(8);
  }
  return "";
}

// Without transparent huge pages in the kernel madvise refuses the advice: alignment only.
bool kernel_has_thp() {
  return std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled").good();
}
// Whether the mapping holding p is advised as huge pages (VmFlags "hg"), or back to small pages
// ("nh").
bool advised_huge(const void* p) { return vm_flags_at(p).find(" hg") != std::string::npos; }
bool advised_small(const void* p) { return vm_flags_at(p).find(" nh") != std::string::npos; }

// Every allocation from 256 KiB its own fresh mapping (no glibc heap memory that an earlier
// block left advised); a no-op under the sanitizers, whose allocators map large blocks afresh.
void fresh_mappings() { (void)mallopt(M_MMAP_THRESHOLD, 256 << 10); }

TEST_F(BlockCache, LargeStorageIsAdvisedAsHugePagesButNotItsTail) {
  fresh_mappings();
  const bool thp = kernel_has_thp();
  const bc::HugePages saved = bc::huge_pages_mode();
  const size_t mb = size_t{1} << 20;
  bc::set_huge_pages(true);
  // 8 MiB + a little: the class of 9 MiB, 4 huge pages and a 1 MiB tail.
  const size_t bytes = 8 * mb + 12345;
  ASSERT_EQ(bc::class_bytes(bytes), 9 * mb);
  auto* p = static_cast<unsigned char*>(bc::take(bytes));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % bc::kHugePageBytes, 0u);
  std::memset(p, 1, bytes);
  EXPECT_EQ(advised_huge(p), thp) << vm_flags_at(p);
  EXPECT_EQ(advised_huge(p + 8 * mb - 1), thp) << vm_flags_at(p + 8 * mb - 1);
  EXPECT_FALSE(advised_small(p + 2 * mb)) << vm_flags_at(p + 2 * mb);
  EXPECT_FALSE(advised_huge(p + 8 * mb)) << vm_flags_at(p + 8 * mb);
  // Below 2 MiB: 64-byte alignment, no advice.
  auto* small = static_cast<unsigned char*>(bc::take(mb + 7));
  std::memset(small, 1, mb + 7);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(small) % 64, 0u);
  EXPECT_FALSE(advised_huge(small)) << vm_flags_at(small);
  // With the advice off (SEQPAR_HUGE_PAGES=0), none.
  bc::set_huge_pages(false);
  auto* plain = static_cast<unsigned char*>(bc::take(16 * mb));
  std::memset(plain, 1, 16 * mb);
  EXPECT_FALSE(advised_huge(plain)) << vm_flags_at(plain);
  bc::give(p, bytes);
  bc::give(small, mb + 7);
  bc::give(plain, 16 * mb);
  bc::set_huge_pages(saved);
}

// SEQPAR_HUGE_PAGES=auto: a storage whose first 2 MiB page was slow to touch keeps that page
// advised and the rest goes back to small pages; after two such storages nothing is advised.
TEST_F(BlockCache, AutoAdvisesSmallPagesAfterSlowFirstTouches) {
  fresh_mappings();
  const bool thp = kernel_has_thp();
  const bc::HugePages saved = bc::huge_pages_mode();
  const size_t mb = size_t{1} << 20, bytes = 8 * mb;
  bc::set_huge_pages(bc::HugePages::kAuto);
  bc::set_first_touch(bc::FirstTouch::kSlow);  // every first touch taken as slow
  auto* a = static_cast<unsigned char*>(bc::take(bytes));
  std::memset(a, 1, bytes);
  EXPECT_EQ(advised_huge(a), thp) << vm_flags_at(a);
  EXPECT_EQ(advised_small(a + 2 * mb), thp) << vm_flags_at(a + 2 * mb);
  EXPECT_EQ(advised_small(a + bytes - 1), thp) << vm_flags_at(a + bytes - 1);
  EXPECT_EQ(bc::slow_first_touches(), 1);
  EXPECT_TRUE(bc::huge_pages());
  auto* b = static_cast<unsigned char*>(bc::take(bytes));
  std::memset(b, 1, bytes);
  EXPECT_EQ(advised_small(b + 2 * mb), thp) << vm_flags_at(b + 2 * mb);
  EXPECT_EQ(bc::slow_first_touches(), 2);
  EXPECT_FALSE(bc::huge_pages());
  auto* c = static_cast<unsigned char*>(bc::take(bytes));  // not advised, not probed
  std::memset(c, 1, bytes);
  EXPECT_FALSE(advised_huge(c)) << vm_flags_at(c);
  EXPECT_FALSE(advised_small(c)) << vm_flags_at(c);
  EXPECT_EQ(bc::slow_first_touches(), 2);
  // Every first touch taken as fast: every page stays advised.
  bc::set_huge_pages(bc::HugePages::kAuto);
  bc::set_first_touch(bc::FirstTouch::kFast);
  EXPECT_TRUE(bc::huge_pages());
  auto* d = static_cast<unsigned char*>(bc::take(2 * bytes));
  std::memset(d, 1, 2 * bytes);
  EXPECT_EQ(advised_huge(d + 2 * bytes - 1), thp) << vm_flags_at(d + 2 * bytes - 1);
  EXPECT_FALSE(advised_small(d + 2 * mb)) << vm_flags_at(d + 2 * mb);
  EXPECT_EQ(bc::slow_first_touches(), 0);
  EXPECT_TRUE(bc::huge_pages());
  for (auto* p : {a, b, c}) bc::give(p, bytes);
  bc::give(d, 2 * bytes);
  bc::set_first_touch(bc::FirstTouch::kTimed);
  bc::set_huge_pages(saved);
}

TEST_F(BlockCache, ThreadsTakeAndGiveConcurrently) {
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([t] {
      for (int i = 0; i < 200; ++i) {
        const size_t bytes = (size_t{1} << 18) * (1 + (i + t) % 5);
        auto* p = static_cast<unsigned char*>(bc::take(bytes));
        std::memset(p, t, bytes);
        for (size_t j = 0; j < bytes; j += 4096) ASSERT_EQ(p[j], t);
        bc::give(p, bytes);
      }
    });
  for (auto& th : ts) th.join();
  EXPECT_LE(bc::cached_bytes(), bc::limit_bytes());
}

}  // namespace
}  // namespace seqpar

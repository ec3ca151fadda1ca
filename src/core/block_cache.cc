#include "seqpar/core/block_cache.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <mutex>
#include <string>
#include <utility>

#include "seqpar/core/error.h"

namespace seqpar::block_cache {

namespace {

constexpr size_t kDefaultLimitMB = 1024;
constexpr unsigned long long kMaxLimitMB = 1ull << 30;  // 1 PiB

// SEQPAR_TENSOR_CACHE_MB: a whole number of MiB (0: keep nothing); anything else is refused.
size_t limit_from_env() {
  const char* v = std::getenv("SEQPAR_TENSOR_CACHE_MB");
  if (v == nullptr || *v == '\0') return kDefaultLimitMB << 20;
  char* end = nullptr;
  errno = 0;
  const unsigned long long mb = std::strtoull(v, &end, 10);
  SEQPAR_ARG_CHECK(*v >= '0' && *v <= '9' && *end == '\0' && errno == 0 && mb <= kMaxLimitMB,
                   "SEQPAR_TENSOR_CACHE_MB='", std::string(v).substr(0, 32),
                   "' is not valid: expected whole MiB from 0 to ", kMaxLimitMB, " (e.g. 1024)");
  return static_cast<size_t>(mb) << 20;
}

// SEQPAR_HUGE_PAGES: auto (the default), 1 or 0; anything else is refused.
HugePages huge_from_env() {
  const char* v = std::getenv("SEQPAR_HUGE_PAGES");
  if (v == nullptr || *v == '\0') return HugePages::kAuto;
  const std::string s(v);
  SEQPAR_ARG_CHECK(s == "auto" || s == "0" || s == "1", "SEQPAR_HUGE_PAGES='", s.substr(0, 32),
                   "' is not valid: expected auto (large tensors on huge pages while their first "
                   "touch is fast, the default), 1 (always) or 0 (never)");
  return s == "auto" ? HugePages::kAuto : s == "1" ? HugePages::kOn : HugePages::kOff;
}

// auto: after this many first touches slower than kSlowFirstTouchSeconds the advice is off for
// the rest of the process.
constexpr int kSlowTouchesToStop = 2;

struct Cache {
  std::mutex mu;
  std::deque<std::pair<size_t, void*>> blocks;  // (class bytes, storage), oldest first
  size_t held = 0;
  size_t limit = limit_from_env();
  std::atomic<HugePages> mode{huge_from_env()};
  std::atomic<int> slow_touches{0};
  std::atomic<FirstTouch> first_touch{FirstTouch::kTimed};

  // Frees the oldest blocks until `room` more bytes fit under `cap`. Holds mu.
  void make_room(size_t room, size_t cap) {
    while (!blocks.empty() && held + room > cap) {
      std::free(blocks.front().second);
      held -= blocks.front().first;
      blocks.pop_front();
    }
  }
};

// Never destroyed: tensors may be freed by other static destructors at exit, after this one would
// have run, and the blocks it holds stay reachable (not leaks) until the process ends.
Cache& cache() {
  static Cache* const c = new Cache;
  return *c;
}

// auto: the advised pages of fresh storage (p, its first `used` bytes: what the tensor asked for,
// not its size class) faulted in here one by one and timed. At the first slow one (the kernel took
// the page from memory the hypervisor has to back again) the pages after it are advised back to
// small pages, and after kSlowTouchesToStop such pages no storage is advised any more.
void fault_in_timed(unsigned char* p, size_t whole, size_t used) {
  Cache& k = cache();
  const FirstTouch judged = k.first_touch.load(std::memory_order_relaxed);
  for (size_t at = 0; at < std::min(whole, used); at += kHugePageBytes) {
    const auto t0 = std::chrono::steady_clock::now();
    *static_cast<volatile unsigned char*>(p + at) = 0;  // contents are unspecified
    const bool slow =
        judged == FirstTouch::kTimed
            ? std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() >
                  kSlowFirstTouchSeconds
            : judged == FirstTouch::kSlow;
    if (!slow) continue;
    const size_t next = at + kHugePageBytes;
    if (next < whole) (void)madvise(p + next, whole - next, MADV_NOHUGEPAGE);
    k.slow_touches.fetch_add(1, std::memory_order_relaxed);
    return;
  }
}

// Storage of class_bytes `bytes` for a tensor of `used` bytes: 64-byte aligned; from
// kHugePageBytes with huge pages on, 2 MiB aligned with its whole 2 MiB pages advised as huge (the
// advice is a hint: where the kernel refuses it the storage is the same, on small pages), and in
// auto mode faulted in and timed.
void* allocate(size_t bytes, size_t used) {
  Cache& k = cache();
  const bool huge = bytes >= kHugePageBytes && huge_pages();
  void* p = nullptr;
  if (posix_memalign(&p, huge ? kHugePageBytes : 64, bytes) != 0 || p == nullptr)
    throw Error(detail::concat("out of memory allocating ", bytes, " bytes"));
  if (huge) {
    const size_t whole = bytes / kHugePageBytes * kHugePageBytes;
    (void)madvise(p, whole, MADV_HUGEPAGE);
    if (k.mode.load(std::memory_order_relaxed) == HugePages::kAuto)
      fault_in_timed(static_cast<unsigned char*>(p), whole, used);
  }
  return p;
}

}  // namespace

size_t class_bytes(size_t bytes) {
  if (bytes < kMinBytes) return bytes == 0 ? 64 : (bytes + 63) / 64 * 64;
  const size_t step = std::bit_floor(bytes) / 8;
  return (bytes + step - 1) / step * step;
}

void* take(size_t bytes) {
  const size_t c = class_bytes(bytes);
  if (c >= kMinBytes) {
    Cache& k = cache();
    std::lock_guard<std::mutex> lk(k.mu);
    for (auto it = k.blocks.rbegin(); it != k.blocks.rend(); ++it) {
      if (it->first != c) continue;
      void* p = it->second;
      k.held -= c;
      k.blocks.erase(std::next(it).base());
      return p;
    }
  }
  return allocate(c, bytes);
}

void give(void* p, size_t bytes) {
  if (p == nullptr) return;
  const size_t c = class_bytes(bytes);
  if (c >= kMinBytes) {
    Cache& k = cache();
    std::lock_guard<std::mutex> lk(k.mu);
    if (c <= k.limit) {
      k.make_room(c, k.limit);
      k.blocks.emplace_back(c, p);
      k.held += c;
      return;
    }
  }
  std::free(p);
}

size_t cached_bytes() {
  Cache& k = cache();
  std::lock_guard<std::mutex> lk(k.mu);
  return k.held;
}

size_t limit_bytes() {
  Cache& k = cache();
  std::lock_guard<std::mutex> lk(k.mu);
  return k.limit;
}

void set_limit_bytes(size_t bytes) {
  Cache& k = cache();
  std::lock_guard<std::mutex> lk(k.mu);
  k.limit = bytes;
  k.make_room(0, bytes);
}

bool huge_pages() {
  const Cache& k = cache();
  const HugePages mode = k.mode.load(std::memory_order_relaxed);
  return mode == HugePages::kOn ||
         (mode == HugePages::kAuto &&
          k.slow_touches.load(std::memory_order_relaxed) < kSlowTouchesToStop);
}

HugePages huge_pages_mode() { return cache().mode.load(std::memory_order_relaxed); }

int slow_first_touches() { return cache().slow_touches.load(std::memory_order_relaxed); }

void set_huge_pages(HugePages mode) {
  Cache& k = cache();
  k.mode.store(mode, std::memory_order_relaxed);
  k.slow_touches.store(0, std::memory_order_relaxed);
}

void set_first_touch(FirstTouch judged) {
  cache().first_touch.store(judged, std::memory_order_relaxed);
}

void set_huge_pages(bool on) { set_huge_pages(on ? HugePages::kOn : HugePages::kOff); }

bool huge_pages_granted() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string mode;
  if (!std::getline(f, mode)) return false;
  return mode.find("[always]") != std::string::npos || mode.find("[madvise]") != std::string::npos;
}

void release() {
  Cache& k = cache();
  std::lock_guard<std::mutex> lk(k.mu);
  k.make_room(0, 0);
}
}  // namespace seqpar::block_cache

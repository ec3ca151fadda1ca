// Reuse of large tensor storage. A transformer pass allocates the same few large activations
// (each layer's hidden states, projections, MLP intermediates) layer after layer; from the C
// library each large one is a fresh mapping whose pages fault in zero-filled on first touch and are
// unmapped again when the tensor goes (measured: 19% of a 256-token Llama-3.2-1B prefill in the
// kernel, page faults and munmap, docs/performance.md section 14). Storage of at least kMinBytes is
// instead kept here when its tensor goes and handed to the next tensor of the same size class.
//
// Size classes: below kMinBytes, 64-byte multiples from the C library as before; from kMinBytes,
// the bytes rounded up to an eighth of their power of two (at most 12.5% more than asked).
// The cache holds at most limit_bytes() (SEQPAR_TENSOR_CACHE_MB, whole MiB, default 1024; 0:
// nothing is kept; another value throws InvalidArgument at the first large allocation) and,
// when a block would exceed it, frees the blocks given longest ago first; a block larger than
// the limit is freed at once. Where the sizes a program allocates change for good (a model's
// load, whose temporaries are the size of a weight; a prefill's activations, sized by its
// tokens, before decode steps of one token each), it calls release(): blocks kept past such a
// point would hold memory no later tensor takes, and the allocations after it would get fresh
// pages while they sit (much slower to fault in under some hypervisors).
//
// Huge pages: storage of at least kHugePageBytes (2 MiB) starts on a 2 MiB boundary, and its
// whole 2 MiB pages are advised to the kernel as huge pages (madvise MADV_HUGEPAGE; Linux's
// transparent huge pages, granted where /sys/kernel/mm/transparent_hugepage/enabled is not
// "never" and a free 2 MiB frame is found). A weight read once per decoded token streams faster
// from them (no page walk and no stop of the hardware prefetcher every 4 KiB), and a fresh
// activation faults in once per 2 MiB instead of once per 4 KiB: docs/performance.md section 21.
// The tail below 2 MiB keeps small pages, so no more memory is touched than asked.
// Where a hypervisor takes memory the guest has freed back (free page reporting) the kernel's
// fresh huge pages can be 20-70x slower to touch than small pages (a 1B model's load took 20-38 s
// more): SEQPAR_HUGE_PAGES=auto, the default, faults fresh advised storage in page by page and
// times each first touch; after a slow one the rest of that storage is advised back to small pages,
// and after two slow ones no storage is advised (section 26). 1 advises always, 0 never; anything
// else throws InvalidArgument at the first large allocation.
// Thread-safety: every function may be called from any thread.
#pragma once

#include <cstddef>

namespace seqpar::block_cache {

inline constexpr size_t kMinBytes = size_t{256} << 10;

inline constexpr size_t kHugePageBytes = size_t{2} << 20;

// The capacity a request of `bytes` gets (its size class).
size_t class_bytes(size_t bytes);
// Storage of class_bytes(bytes), 64-byte aligned (from kHugePageBytes with huge pages on, 2 MiB
// aligned and advised), contents unspecified; throws seqpar::Error when memory is exhausted.
void* take(size_t bytes);
// Returns storage from take(bytes) (the same `bytes`).
void give(void* p, size_t bytes);

// What the cache holds now, and its limit.
size_t cached_bytes();
size_t limit_bytes();
// Sets the limit (tests, or a program that wants its memory back: 0 frees every block held).
void set_limit_bytes(size_t bytes);
enum class HugePages { kOff, kOn, kAuto };
// auto: a first touch of a 2 MiB page slower than this is slow. Small pages fault 2 MiB in about
// 1 ms even on a guest that backs fresh memory slowly; a huge page the host had to back again
// took 13-30 ms there, one it still backed 0.4 ms (docs/performance.md section 26).
inline constexpr double kSlowFirstTouchSeconds = 2e-3;
// Whether storage from now on is advised as huge pages, the mode (SEQPAR_HUGE_PAGES), and the
// slow first touches auto has seen. huge_pages_granted(): the kernel's setting allows huge pages
// to madvised memory.
bool huge_pages();
HugePages huge_pages_mode();
int slow_first_touches();
bool huge_pages_granted();
// How auto judges a first touch: timed against kSlowFirstTouchSeconds (the default), or every
// touch taken as slow or as fast (tests: what follows from each, with no time measured).
enum class FirstTouch { kTimed, kSlow, kFast };
// Setters (tests, benchmarks): the mode, the count of slow touches started again;
// set_huge_pages(bool): kOn or kOff; how first touches are judged.
void set_huge_pages(HugePages mode);
void set_huge_pages(bool on);
void set_first_touch(FirstTouch judged);
// Frees every block held; the limit stays.
void release();

}  // namespace seqpar::block_cache

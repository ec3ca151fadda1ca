// The largest sizes seqpar accepts, stated once, and overflow-safe arithmetic over them.
//
// Every size that comes from a user (command line, API) is checked against one of the maxima
// below before any work or memory is sized by it; products of sizes (bytes of a tensor, score
// elements of an attention) go through checked_mul / checked_add, which throw InvalidArgument
// naming the quantity instead of wrapping. The maxima are far above what runs on one machine;
// whether a job fits the machine is a separate check (memory_available_bytes).
//
// Thread-safety: constants and pure functions; safe from any thread.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "seqpar/core/error.h"

namespace seqpar::limits {

inline constexpr int64_t kMaxRanks = int64_t{1} << 16;  // world size, any mesh degree
inline constexpr int64_t kMaxThreads = int64_t{1}
                                       << 12;  // threads of one process (ranks x per rank)
inline constexpr int64_t kMaxTokens = int64_t{1} << 32;   // sequence, cached, new, text tokens
inline constexpr int64_t kMaxHeads = int64_t{1} << 16;    // attention heads (query or kv)
inline constexpr int64_t kMaxHeadDim = int64_t{1} << 14;  // head dimension
inline constexpr int64_t kMaxBatch = int64_t{1} << 16;    // batch size
inline constexpr int64_t kMaxPixels = int64_t{1} << 20;   // frames, height or width of an image
inline constexpr int64_t kMaxSteps = int64_t{1} << 20;    // repetitions, denoising / decode steps
// B·H·S·S: attention score elements of one call; keeps every work count inside int64.
inline constexpr int64_t kMaxScoreElements = int64_t{1} << 62;
inline constexpr int64_t kMaxFileBytes = int64_t{1} << 24;  // a JSON profile or config read whole
inline constexpr double kMinTimeoutSeconds = 0.001;
inline constexpr double kMaxTimeoutSeconds = 7 * 24 * 3600.0;

// "2^16" for powers of two, the decimal value otherwise.
std::string max_text(int64_t max);

// Throws InvalidArgument "<name> <value> is out of range; valid: <lo> to <hi>" unless
// lo <= value <= hi.
void check_range(std::string_view name, int64_t value, int64_t lo, int64_t hi);
// The same for a real value; NaN and infinities are refused.
void check_range(std::string_view name, double value, double lo, double hi);

// a·b and a+b for non-negative a, b; InvalidArgument naming `what` if the result exceeds
// INT64_MAX (or `max` when given, with the maximum in the message): a ParamError where `what`
// names parameters with param() (core/param_error.h), the first of them its parameter.
int64_t checked_mul(int64_t a, int64_t b, std::string_view what,
                    int64_t max = std::numeric_limits<int64_t>::max());
int64_t checked_add(int64_t a, int64_t b, std::string_view what,
                    int64_t max = std::numeric_limits<int64_t>::max());
// The product of all factors (each >= 0), checked as above.
int64_t checked_product(std::initializer_list<int64_t> factors, std::string_view what,
                        int64_t max = std::numeric_limits<int64_t>::max());

// The decimal integer in s (optional sign, digits only), or nullopt if s is not one or does not
// fit int64 (no saturation).
std::optional<int64_t> parse_int64(std::string_view s);

// The divisors of x >= 1 in increasing order, from its prime factorisation (Pollard's rho), so
// a 19-digit x takes microseconds. At most 103680 divisors for any int64.
std::vector<int64_t> divisors(int64_t x);

// Bytes of memory this machine can give a new job (MemAvailable of /proc/meminfo); nullopt if
// unknown.
std::optional<int64_t> memory_available_bytes();

// "12.3 GB"
std::string bytes_text(double bytes);

// Throws InvalidArgument "<what> needs about X GB of memory but this machine has Y GB available
// (MemAvailable)" when need_bytes exceeds what is available (nothing when unknown).
void check_fits_memory(std::string_view what, double need_bytes);

// The processes an MPI launcher started on this machine (OMPI_COMM_WORLD_LOCAL_SIZE of Open MPI,
// MPI_LOCALNRANKS of MPICH); 1 when neither is set.
int64_t local_processes();

// check_fits_memory for the ranks of a `backend` ("threads": all `world` ranks are threads of
// this process; "mpi": one rank per process, local_processes() of them here), each needing
// bytes_per_rank: "<what> needs about X GB of memory (N ranks on this machine, Y GB each) but
// this machine has Z GB available (MemAvailable)".
void check_ranks_fit_memory(std::string_view what, double bytes_per_rank, int64_t world,
                            std::string_view backend);

// The most threads this process should start: min(kMaxThreads, RLIMIT_NPROC's soft limit). The
// limit counts all of the user's threads, so starting fewer can still fail (ThreadWorld::run
// turns that into an Error).
int64_t max_threads();

// Throws InvalidArgument unless `ranks` rank threads of `threads` kernel threads each fit one
// process (max_threads()): "ranks R x threads T = N threads in one process exceeds the maximum M".
void check_threads(int64_t ranks, int64_t threads);

}  // namespace seqpar::limits

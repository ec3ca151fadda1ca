#include "seqpar/core/limits.h"

#include <sys/resource.h>

#include <algorithm>
#include <bit>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>

#include "seqpar/core/param_error.h"

namespace seqpar {

// Declared in error.h: a message lists at most 32 divisors (the 16 smallest, the 16 largest).
std::string divisors_text(int64_t x) {
  const std::vector<int64_t> d = limits::divisors(x);
  constexpr size_t kEnds = 16;
  std::string s;
  for (size_t i = 0; i < d.size(); ++i) {
    if (d.size() > 2 * kEnds && i == kEnds) {
      s += detail::concat(", ... (", d.size() - 2 * kEnds, " more)");
      i = d.size() - kEnds;
    }
    s += (s.empty() ? "" : ", ") + std::to_string(d[i]);
  }
  return s;
}

namespace limits {

namespace {

using u64 = uint64_t;
using u128 = unsigned __int128;

u64 mul_mod(u64 a, u64 b, u64 m) { return static_cast<u64>(static_cast<u128>(a) * b % m); }

u64 pow_mod(u64 b, u64 e, u64 m) {
  u64 r = 1;
  for (b %= m; e > 0; e >>= 1, b = mul_mod(b, b, m))
    if (e & 1) r = mul_mod(r, b, m);
  return r;
}

// Deterministic Miller-Rabin for 64-bit n (these bases suffice below 2^64).
bool is_prime(u64 n) {
  if (n < 2) return false;
  for (u64 p : {2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37})
    if (n % p == 0) return n == p;
  u64 d = n - 1;
  int s = 0;
  for (; d % 2 == 0; d /= 2) ++s;
  for (u64 a : {2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37}) {
    u64 x = pow_mod(a, d, n);
    if (x == 1 || x == n - 1) continue;
    bool composite = true;
    for (int i = 1; i < s && composite; ++i) {
      x = mul_mod(x, x, n);
      if (x == n - 1) composite = false;
    }
    if (composite) return false;
  }
  return true;
}

// A non-trivial factor of the composite, odd n (Pollard's rho, Brent's cycle finding).
u64 rho(u64 n) {
  for (u64 c = 1;; ++c) {
    auto f = [&](u64 x) { return (mul_mod(x, x, n) + c) % n; };
    u64 x = 2, y = 2, d = 1;
    while (d == 1) {
      x = f(x);
      y = f(f(y));
      d = std::gcd(x > y ? x - y : y - x, n);
    }
    if (d != n) return d;
  }
}

void factor(u64 n, std::vector<u64>& primes) {
  if (n == 1) return;
  for (u64 p : {2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37})
    if (n % p == 0) {
      primes.push_back(p);
      return factor(n / p, primes);
    }
  if (is_prime(n)) {
    primes.push_back(n);
    return;
  }
  const u64 d = rho(n);
  factor(d, primes);
  factor(n / d, primes);
}

}  // namespace

std::string max_text(int64_t max) {
  if (max > 0 && (max & (max - 1)) == 0 && max >= 1024)
    return detail::concat(max, " (2^", std::countr_zero(static_cast<u64>(max)), ")");
  return std::to_string(max);
}

void check_range(std::string_view name, int64_t value, int64_t lo, int64_t hi) {
  const std::string valid = detail::concat(lo, " to ", max_text(hi));
  SEQPAR_PARAM_CHECK(value >= lo && value <= hi, std::string(name), valid, param(name), " ", value,
                     " is out of range; valid: ", valid);
}

void check_range(std::string_view name, double value, double lo, double hi) {
  const std::string valid = detail::concat(lo, " to ", hi);
  SEQPAR_PARAM_CHECK(std::isfinite(value) && value >= lo && value <= hi, std::string(name), valid,
                     param(name), " ", value, " is out of range; valid: ", valid);
}

int64_t checked_mul(int64_t a, int64_t b, std::string_view what, int64_t max) {
  SEQPAR_CHECK(a >= 0 && b >= 0, what, ": negative factor");
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r) || r > max)
    throw_marked(detail::concat(what, " (", a, " x ", b, ") exceeds the maximum ", max_text(max)));
  return r;
}

int64_t checked_add(int64_t a, int64_t b, std::string_view what, int64_t max) {
  SEQPAR_CHECK(a >= 0 && b >= 0, what, ": negative term");
  int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r) || r > max)
    throw_marked(detail::concat(what, " (", a, " + ", b, ") exceeds the maximum ", max_text(max)));
  return r;
}

int64_t checked_product(std::initializer_list<int64_t> factors, std::string_view what,
                        int64_t max) {
  int64_t r = 1;
  for (int64_t f : factors) {
    SEQPAR_CHECK(f >= 0, what, ": negative factor");
    if (__builtin_mul_overflow(r, f, &r) || r > max)
      throw_marked(detail::concat(what, " exceeds the maximum ", max_text(max)));
  }
  return r;
}

std::optional<int64_t> parse_int64(std::string_view s) {
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  if (s.empty()) return std::nullopt;
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

std::vector<int64_t> divisors(int64_t x) {
  SEQPAR_CHECK(x >= 1, "divisors of ", x);
  std::vector<u64> primes;
  factor(static_cast<u64>(x), primes);
  std::sort(primes.begin(), primes.end());
  std::vector<int64_t> d = {1};
  for (size_t i = 0; i < primes.size();) {
    size_t j = i;
    while (j < primes.size() && primes[j] == primes[i]) ++j;
    const size_t base = d.size();
    int64_t pk = 1;
    for (size_t k = i; k < j; ++k) {
      pk *= static_cast<int64_t>(primes[i]);
      for (size_t t = 0; t < base; ++t) d.push_back(d[t] * pk);
    }
    i = j;
  }
  std::sort(d.begin(), d.end());
  return d;
}

std::optional<int64_t> memory_available_bytes() {
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  if (f == nullptr) return std::nullopt;
  char line[256];
  long long kb = -1;
  while (std::fgets(line, sizeof line, f) != nullptr)
    if (std::sscanf(line, "MemAvailable: %lld kB", &kb) == 1) break;
  std::fclose(f);
  if (kb < 0) return std::nullopt;
  return static_cast<int64_t>(kb) * 1024;
}

std::string bytes_text(double bytes) {
  char buf[48];
  if (bytes >= 1e9)
    std::snprintf(buf, sizeof buf, "%.3g GB", bytes / 1e9);
  else
    std::snprintf(buf, sizeof buf, "%.3g MB", bytes / 1e6);
  return buf;
}

void check_fits_memory(std::string_view what, double need_bytes) {
  const std::optional<int64_t> avail = memory_available_bytes();
  if (!avail) return;
  SEQPAR_ARG_CHECK(need_bytes <= static_cast<double>(*avail), what, " needs about ",
                   bytes_text(need_bytes), " of memory but this machine has ",
                   bytes_text(static_cast<double>(*avail)), " available (MemAvailable)");
}

int64_t local_processes() {
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"}) {
    const char* v = std::getenv(var);
    if (v == nullptr) continue;
    char* end = nullptr;
    const long long n = std::strtoll(v, &end, 10);
    if (end != v && *end == '\0' && n >= 1 && n <= kMaxRanks) return n;
  }
  return 1;
}

void check_ranks_fit_memory(std::string_view what, double bytes_per_rank, int64_t world,
                            std::string_view backend) {
  const std::optional<int64_t> avail = memory_available_bytes();
  if (!avail) return;
  const int64_t here = backend == "mpi" ? std::min(local_processes(), world) : world;
  const double need = bytes_per_rank * static_cast<double>(here);
  SEQPAR_ARG_CHECK(need <= static_cast<double>(*avail), what, " needs about ", bytes_text(need),
                   " of memory (", here, here == 1 ? " rank" : " ranks", " on this machine, ",
                   bytes_text(bytes_per_rank), " each) but this machine has ",
                   bytes_text(static_cast<double>(*avail)), " available (MemAvailable)");
}

int64_t max_threads() {
  rlimit rl{};
  if (getrlimit(RLIMIT_NPROC, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return kMaxThreads;
  return std::min<int64_t>(kMaxThreads, static_cast<int64_t>(rl.rlim_cur));
}

void check_threads(int64_t ranks, int64_t threads) {
  check_range("ranks", ranks, 1, kMaxRanks);
  check_range("threads", threads, 1, kMaxThreads);
  const int64_t max = max_threads();
  SEQPAR_PARAM_CHECK(
      ranks * threads <= max, "ranks", "", param("ranks"), " ", ranks, " x ", param("threads"), " ",
      threads, " = ", ranks * threads, " threads in one process exceeds the maximum ", max,
      " (core/limits.h and RLIMIT_NPROC); use fewer ranks or threads, or the mpi ", "backend");
}

}  // namespace limits
}  // namespace seqpar

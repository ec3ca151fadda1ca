// core/limits.h: the stated maxima, overflow-safe arithmetic, integer parsing without
// saturation, and divisors of any int64 in microseconds.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include <nlohmann/json.hpp>
#include <string>

#include "seqpar/core/json_limits.h"
#include "seqpar/core/limits.h"

namespace seqpar {
namespace {

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

TEST(Limits, CheckedMulAndAdd) {
  EXPECT_EQ(limits::checked_mul(1 << 20, 1 << 20, "bytes"), int64_t{1} << 40);
  EXPECT_EQ(limits::checked_add(kInt64Max - 1, 1, "tokens"), kInt64Max);
  EXPECT_THROW(limits::checked_mul(int64_t{1} << 32, int64_t{1} << 31, "bytes"), InvalidArgument);
  EXPECT_THROW(limits::checked_add(kInt64Max, 1, "tokens"), InvalidArgument);
  EXPECT_THROW(limits::checked_mul(3, 4, "ranks", 11), InvalidArgument);
  EXPECT_EQ(limits::checked_product({2, 3, 7}, "world"), 42);
  EXPECT_THROW(limits::checked_product({65536, 65536, 65536, 65536}, "world"), InvalidArgument);
  try {
    limits::checked_mul(kInt64Max, 2, "K/V bytes");
    FAIL() << "no throw";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("K/V bytes"), std::string::npos) << e.what();
  }
}

TEST(Limits, CheckRange) {
  EXPECT_NO_THROW(limits::check_range("--seq", int64_t{5}, 1, limits::kMaxTokens));
  EXPECT_THROW(limits::check_range("--seq", int64_t{0}, 1, limits::kMaxTokens), InvalidArgument);
  EXPECT_THROW(limits::check_range("--seq", kInt64Max, 1, limits::kMaxTokens), InvalidArgument);
  EXPECT_THROW(limits::check_range("--timeout", std::nan(""), 0.001, 1.0), InvalidArgument);
  EXPECT_THROW(limits::check_range("--timeout", INFINITY, 0.001, 1.0), InvalidArgument);
  EXPECT_THROW(limits::check_range("--timeout", 0.0001, 0.001, 1.0), InvalidArgument);
}

TEST(Limits, ParseInt64DoesNotSaturate) {
  EXPECT_EQ(limits::parse_int64("9223372036854775807"), kInt64Max);
  EXPECT_EQ(limits::parse_int64("-9223372036854775808"), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(limits::parse_int64("+12"), 12);
  EXPECT_FALSE(limits::parse_int64("9223372036854775808"));
  EXPECT_FALSE(limits::parse_int64("-9223372036854775809"));
  EXPECT_FALSE(limits::parse_int64("12x"));
  EXPECT_FALSE(limits::parse_int64(""));
  EXPECT_FALSE(limits::parse_int64("1e3"));
}

TEST(Limits, DivisorsSmall) {
  EXPECT_EQ(limits::divisors(1), (std::vector<int64_t>{1}));
  EXPECT_EQ(limits::divisors(12), (std::vector<int64_t>{1, 2, 3, 4, 6, 12}));
  EXPECT_EQ(limits::divisors(97), (std::vector<int64_t>{1, 97}));
  for (int64_t x = 1; x <= 2000; ++x) {
    std::vector<int64_t> naive;
    for (int64_t d = 1; d <= x; ++d)
      if (x % d == 0) naive.push_back(d);
    ASSERT_EQ(limits::divisors(x), naive) << x;
  }
  EXPECT_EQ(divisors_text(8), "1, 2, 4, 8");
}

// divisors() factorises x: a loop over every candidate up to x would not finish
// on the prime (ctest's timeout is the bound; tests judge results, not time).
TEST(Limits, DivisorsOfNineteenDigitNumbers) {
  // A prime, a semiprime of two 31-bit primes, INT64_MAX (7^2·73·127·337·92737·649657), 2^62.
  EXPECT_EQ(limits::divisors(9223372036854775783), (std::vector<int64_t>{1, 9223372036854775783}));
  const int64_t p = 2147483647, q = 2147483629;
  EXPECT_EQ(limits::divisors(p * q), (std::vector<int64_t>{1, q, p, p * q}));
  EXPECT_EQ(limits::divisors(kInt64Max).size(), 96u);
  EXPECT_EQ(limits::divisors(int64_t{1} << 62).size(), 63u);
  // 897612484786617600 has 103680 divisors, the most of any int64; the message lists 32.
  EXPECT_EQ(limits::divisors(897612484786617600).size(), 103680u);
  const std::string text = divisors_text(897612484786617600);
  EXPECT_NE(text.find("(103648 more)"), std::string::npos) << text;
  EXPECT_LT(text.size(), 600u);
}

TEST(Limits, MemoryAvailableIsKnownOnLinux) {
  const auto m = limits::memory_available_bytes();
  ASSERT_TRUE(m.has_value());
  EXPECT_GT(*m, 0);
  EXPECT_THROW(limits::check_fits_memory("a test", 1e30), InvalidArgument);
  EXPECT_NO_THROW(limits::check_fits_memory("a test", 1.0));
  EXPECT_GE(limits::max_threads(), 1);
  EXPECT_LE(limits::max_threads(), limits::kMaxThreads);
}

// A string or key cut at the quote's byte budget inside a UTF-8 sequence is quoted, not thrown
// on (fuzz_json_config found nlohmann's dump() throwing type_error 316 there).
TEST(JsonLimits, ExcerptCutsInsideUtf8) {
  const std::string long_utf8 = std::string(59, 'a') + "\u00e9\u00e9\u00e9";
  for (const char* text : {R"({"k":"%s"})", R"({"%s":1})", R"(["%s"])"}) {
    std::string json_text(text);
    json_text.replace(json_text.find("%s"), 2, long_utf8);
    const nlohmann::json j = nlohmann::json::parse(json_text);
    std::string quote;
    ASSERT_NO_THROW(quote = json_excerpt(j)) << json_text;
    EXPECT_LE(quote.size(), kMessageQuoteChars);
    for (char c : quote) EXPECT_TRUE(c >= 0x20 && c < 0x7f) << quote;
  }
}

}  // namespace
}  // namespace seqpar

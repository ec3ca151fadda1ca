// WeightStore over checkpoint files (rows and columns read in the stored dtype, only the bytes
// asked for, finiteness checked per read) and linear with a bf16/fp16 weight, against fp32
// computed from the same values in double precision.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>

#include "seqpar/model/blocks/linear.h"
#include "seqpar/model/context.h"
#include "seqpar/model/ops.h"
#include "seqpar/model/safetensors.h"

namespace seqpar {
namespace {

Tensor random_tensor(std::vector<int64_t> shape, uint64_t seed, DType dtype = DType::kF32) {
  Tensor t(std::move(shape));
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 1.f);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng);
  return t.to(dtype);
}

// y = x · wᵀ + b in double from fp32 copies of the operands.
std::vector<double> linear_reference(const Tensor& x, const Tensor& w, const Tensor& b) {
  const Tensor xf = x.to(DType::kF32), wf = w.to(DType::kF32);
  const int64_t m = xf.numel() / xf.dim(-1), k = wf.dim(1), n = wf.dim(0);
  std::vector<double> y(m * n);
  for (int64_t r = 0; r < m; ++r)
    for (int64_t j = 0; j < n; ++j) {
      double acc = b.empty() ? 0.0 : b.data<float>()[j];
      for (int64_t i = 0; i < k; ++i)
        acc += double(xf.data<float>()[r * k + i]) * wf.data<float>()[j * k + i];
      y[r * n + j] = acc;
    }
  return y;
}

TEST(Linear, SixteenBitWeightsConvertedPerBlockEqualFp32) {
  // n spans several conversion blocks and a ragged last block; from 65 rows oneDNN multiplies
  // them, each block's columns computed into rows of their own and copied into y (ops.cc
  // matmul()).
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16})
    for (int64_t m : {1, 3, 17, 65, 300})
      for (auto [n, k] : {std::pair<int64_t, int64_t>{5, 7}, {333, 1536}, {96, 64}}) {
        const Tensor x = random_tensor({m, k}, 1), w = random_tensor({n, k}, 2, dt);
        const Tensor b = random_tensor({n}, 3);
        const Tensor y = linear(x, w, b);
        const std::vector<double> ref = linear_reference(x, w, b);
        double worst = 0;
        for (int64_t i = 0; i < y.numel(); ++i)
          worst = std::max(worst, std::abs(y.data<float>()[i] - ref[i]) / std::sqrt(double(k)));
        // fp32 accumulation of k products of N(0,1) values in one sequence (as a GEMM kernel's
        // k loop may run): partial sums of size ~sqrt(i) each rounded to u = 2^-24, so the error
        // is ~u·k/sqrt(2) (a random walk), up to ~4 times that at the worst of thousands of
        // outputs: relative to sqrt(k), 4·u·sqrt(k) (9.3e-6 at k = 1536; measured up to 3.5e-6
        // where oneDNN's AVX-512 kernel runs, 2e-6 on AVX2).
        const double bound = 4 * std::ldexp(1.0, -24) * std::sqrt(double(k));
        EXPECT_LT(worst, bound) << dtype_name(dt) << " m " << m << " n " << n << " k " << k;
      }
}

class FileStore : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = ::testing::TempDir() + "seqpar_weight_store.safetensors";
    tensors_["model.w"] = random_tensor({12, 10}, 4, DType::kBF16);
    tensors_["model.b"] = random_tensor({12}, 5, DType::kF16);
    tensors_["model.f"] = random_tensor({6, 4}, 6);
    write_safetensors(path_, tensors_);
    file_ = std::make_shared<const SafetensorsFile>(path_);
  }
  std::string path_;
  std::map<std::string, Tensor> tensors_;
  std::shared_ptr<const SafetensorsFile> file_;
};

void expect_equal_bits(const Tensor& a, const Tensor& b) {
  ASSERT_EQ(a.shape(), b.shape());
  ASSERT_EQ(a.dtype(), b.dtype());
  EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0);
}

TEST_F(FileStore, RowsAndColumnsInTheStoredDtypeReadOnlyWhatIsAsked) {
  WeightStore ws;
  ws.map("w", file_, "model.w");
  ws.map("b", file_, "model.b");
  ws.map("f", file_, "model.f");
  EXPECT_EQ(ws.bytes_read(), 0);
  EXPECT_EQ(ws.dtype("w"), DType::kBF16);
  EXPECT_EQ(ws.shape("w"), (std::vector<int64_t>{12, 10}));
  expect_equal_bits(ws.rows("w", 3, 9), slice_rows(tensors_["model.w"], 3, 9));
  EXPECT_EQ(ws.bytes_read(), 6 * 10 * 2);
  expect_equal_bits(ws.cols("w", 2, 7), slice_cols(tensors_["model.w"], 2, 7));
  EXPECT_EQ(ws.bytes_read(), 6 * 10 * 2 + 12 * 5 * 2);
  expect_equal_bits(ws.rows("b", 4, 8), slice_rows(tensors_["model.b"], 4, 8));
  expect_equal_bits(ws.get("f"), tensors_["model.f"]);
  expect_equal_bits(ws.get("w"), tensors_["model.w"].to(DType::kF32));
  // In memory: the same calls.
  WeightStore mem;
  mem.set("w", tensors_["model.w"]);
  expect_equal_bits(mem.cols("w", 2, 7), ws.cols("w", 2, 7));
  expect_equal_bits(mem.rows("w", 0, 12), tensors_["model.w"]);
  EXPECT_EQ(ws.names(), (std::vector<std::string>{"b", "f", "w"}));
}

TEST_F(FileStore, NonFiniteSliceIsRefusedNamingTheTensor) {
  Tensor poisoned = tensors_["model.w"].to(DType::kF32);
  poisoned.data<float>()[7 * 10 + 3] = std::numeric_limits<float>::quiet_NaN();
  tensors_["model.w"] = poisoned.to(DType::kBF16);
  write_safetensors(path_, tensors_);
  auto file = std::make_shared<const SafetensorsFile>(path_);
  WeightStore ws;
  ws.map("w", file, "model.w");
  EXPECT_NO_THROW(ws.rows("w", 0, 7));  // the NaN is in row 7: not read
  try {
    ws.cols("w", 0, 5);
    FAIL() << "no throw";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'model.w' holds a non-finite value"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(ws.map("x", file, "model.missing"), InvalidArgument);
}

// row_abs_max: max |w| of every row, read through the file like rows() (finiteness checked) but
// not counted in bytes_read (nothing of it is held).
TEST_F(FileStore, RowAbsMaxOfEveryRowCountsNoBytes) {
  WeightStore ws;
  ws.map("w", file_, "model.w");
  const Tensor amax = ws.row_abs_max("w");
  EXPECT_EQ(ws.bytes_read(), 0);
  const Tensor w = tensors_["model.w"].to(DType::kF32);
  ASSERT_EQ(amax.shape(), (std::vector<int64_t>{12}));
  for (int64_t j = 0; j < 12; ++j) {
    float a = 0.f;
    for (int64_t i = 0; i < 10; ++i) a = std::max(a, std::fabs(w.data<float>()[j * 10 + i]));
    EXPECT_EQ(amax.data<float>()[j], a) << "row " << j;
  }
  Tensor poisoned = w;
  poisoned.data<float>()[11 * 10 + 9] = INFINITY;
  tensors_["model.w"] = poisoned.to(DType::kBF16);
  write_safetensors(path_, tensors_);
  WeightStore bad;
  bad.map("w", std::make_shared<const SafetensorsFile>(path_), "model.w");
  EXPECT_THROW(bad.row_abs_max("w"), InvalidArgument);
}

// Per-channel int8 over a row-parallel split: each rank's columns carry the whole row's scale and
// the whole matrix's int8 values, so the ranks' partial products add up to one rank's product
// within the rounding of that sum; column-parallel shares are whole rows, quantized as they are.
TEST_F(FileStore, Int8ChannelRowParallelSharesMatchOneRank) {
  WeightStore ws;
  ws.map("o.weight", file_, "model.w");
  ws.set_weight_format(WeightFormat::kInt8Channel);
  EXPECT_TRUE(ws.int8_matrices());
  const RowLinear one = RowLinear::load(ws, "o", 0, 10, false);
  const RowLinear a = RowLinear::load(ws, "o", 0, 3, false),
                  b = RowLinear::load(ws, "o", 3, 10, false);
  ASSERT_EQ(one.w.dtype(), DType::kI8);
  ASSERT_EQ(one.w_scale.dtype(), DType::kF32);
  for (const RowLinear* part : {&a, &b}) expect_equal_bits(part->w_scale, one.w_scale);
  for (int64_t j = 0; j < 12; ++j)
    for (int64_t i = 0; i < 10; ++i) {
      const RowLinear& p = i < 3 ? a : b;
      const int64_t c = i < 3 ? i : i - 3, width = i < 3 ? 3 : 7;
      ASSERT_EQ(p.w.data<int8_t>()[j * width + c], one.w.data<int8_t>()[j * 10 + i])
          << j << " " << i;
    }
  const Tensor x = random_tensor({2, 10}, 9);
  Tensor xa({2, 3}), xb({2, 7});
  for (int64_t r = 0; r < 2; ++r)
    for (int64_t i = 0; i < 10; ++i)
      (i < 3 ? xa.data<float>()[r * 3 + i] : xb.data<float>()[r * 7 + i - 3]) =
          x.data<float>()[r * 10 + i];
  const Tensor y = linear(x, one.w, Tensor(), one.w_scale);
  const Tensor ya = linear(xa, a.w, Tensor(), a.w_scale), yb = linear(xb, b.w, Tensor(), b.w_scale);
  for (int64_t e = 0; e < y.numel(); ++e) {
    const int64_t r = e / 12, j = e % 12;
    double mag = 0;
    for (int64_t i = 0; i < 10; ++i)
      mag += std::fabs(double{x.data<float>()[r * 10 + i]} * one.w.data<int8_t>()[j * 10 + i]);
    mag *= one.w_scale.data<float>()[j];
    // each side within γ_14 of the exact sum (10 products, their sums, the scale, the add)
    const double bound = 2 * 14 * std::ldexp(1.0, -24) * mag;
    EXPECT_LE(
        std::fabs(double{y.data<float>()[e]} - (double{ya.data<float>()[e]} + yb.data<float>()[e])),
        bound)
        << "output " << e;
  }
  // Column-parallel shares: whole rows, the rows of the one-rank weight.
  const ColumnLinear c = ColumnLinear::load(ws, "o", 4, 9, false);
  for (int64_t j = 0; j < 5; ++j)
    EXPECT_EQ(c.w_scale.data<float>()[j], one.w_scale.data<float>()[4 + j]) << "row " << j;
}

TEST(WeightFormat, NamesAndTheirList) {
  EXPECT_EQ(weight_format_named("checkpoint"), WeightFormat::kCheckpoint);
  EXPECT_EQ(weight_format_named("int8"), WeightFormat::kQ8_0);
  EXPECT_EQ(weight_format_named("int8-channel"), WeightFormat::kInt8Channel);
  EXPECT_EQ(weight_format_named("int4"), std::nullopt);
  EXPECT_EQ(weight_format_name(WeightFormat::kInt8Channel), "int8-channel");
  EXPECT_EQ(weight_format_names(), "checkpoint, int8, int8-channel");
  EXPECT_EQ(weight_format_names("'"), "'checkpoint', 'int8', 'int8-channel'");
  WeightStore ws;
  ws.set_int8_matrices(true);
  EXPECT_EQ(ws.weight_format(), WeightFormat::kQ8_0);
  ws.set_int8_matrices(false);
  EXPECT_EQ(ws.weight_format(), WeightFormat::kCheckpoint);
}

}  // namespace
}  // namespace seqpar

// The safetensors reader against hand-built files: every malformed header is rejected with one
// line naming the file, the tensor and the problem; what the writer writes reads back bit-exact.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "seqpar/model/safetensors.h"

namespace seqpar {
namespace {

namespace fs = std::filesystem;

// A scratch directory per test, removed afterwards.
class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("seqpar_st_" + std::to_string(::getpid()) + "_" + info->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // Writes raw bytes.
  std::string write_bytes(const std::string& name, const std::string& bytes) const {
    const std::string p = path(name);
    std::ofstream(p, std::ios::binary).write(bytes.data(), bytes.size());
    return p;
  }
  // Writes [8-byte size][header][data] with the size field as given (defaults to the header's).
  std::string write_file(const std::string& name, const std::string& header, size_t data_bytes,
                         int64_t size_field = -1) const {
    const uint64_t n = size_field < 0 ? header.size() : static_cast<uint64_t>(size_field);
    std::string bytes(8, '\0');
    std::memcpy(bytes.data(), &n, 8);
    bytes += header;
    bytes.append(data_bytes, '\x01');
    return write_bytes(name, bytes);
  }

  // Expects opening `p` to throw InvalidArgument with a one-line message holding the file name
  // and every fragment.
  void expect_rejected(const std::string& p, std::initializer_list<std::string> fragments) const {
    try {
      SafetensorsFile f(p);
      ADD_FAILURE() << p << " was accepted";
    } catch (const InvalidArgument& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
      EXPECT_EQ(msg.rfind(p + ": ", 0), 0u) << "does not start with the path: " << msg;
      for (const auto& f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << msg;
    }
  }

  fs::path dir_;
};

Tensor random_tensor(std::vector<int64_t> shape, DType dtype, uint32_t seed) {
  Tensor f(shape, DType::kF32);
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist;
  for (int64_t i = 0; i < f.numel(); ++i) f.data<float>()[i] = dist(rng);
  return f.to(dtype);
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// ---- round trips ----------------------------------------------------------------------------

TEST_F(SafetensorsTest, RoundTripsAllThreeDtypes) {
  std::map<std::string, Tensor> tensors;
  tensors["blocks.0.attn.q.weight"] = random_tensor({64, 48}, DType::kF32, 1);
  tensors["blocks.0.attn.k.weight"] = random_tensor({16, 48}, DType::kBF16, 2);
  tensors["blocks.0.norm.weight"] = random_tensor({48}, DType::kF16, 3);
  tensors["patch_embedding.weight"] = random_tensor({8, 4, 1, 2, 2}, DType::kBF16, 4);  // 5-D
  tensors["scale"] = random_tensor({}, DType::kF32, 5);                                 // scalar
  tensors["odd"] = random_tensor({3}, DType::kF16, 6);  // 6 bytes: later offsets not aligned
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"model", "tiny-dit"}};
  const std::string p = path("model.safetensors");
  write_safetensors(p, tensors, meta);

  SafetensorsFile f(p);
  EXPECT_EQ(f.path(), p);
  EXPECT_EQ(f.size(), tensors.size());
  EXPECT_EQ(f.metadata(), meta);
  std::vector<std::string> names;
  for (const auto& [name, t] : tensors) names.push_back(name);
  EXPECT_EQ(f.names(), names);
  for (const auto& [name, t] : tensors) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(f.contains(name));
    const SafetensorsEntry& e = f.entry(name);
    EXPECT_EQ(e.shape, t.shape());
    EXPECT_EQ(e.dtype, safetensors_dtype_name(t.dtype()));
    EXPECT_EQ(e.seqpar_dtype(), t.dtype());
    EXPECT_EQ(e.nbytes(), t.nbytes());
    EXPECT_EQ(e.numel(), t.numel());
    EXPECT_TRUE(same_bytes(f.tensor(name), t));
    EXPECT_EQ(std::memcmp(f.bytes(name).data(), t.raw(), t.nbytes()), 0);
    // Conversion: to fp32 exact; to the stored dtype a plain copy.
    EXPECT_TRUE(same_bytes(f.tensor(name, DType::kF32), t.to(DType::kF32)));
    EXPECT_TRUE(same_bytes(f.tensor(name, t.dtype()), t));
  }
  EXPECT_FALSE(f.contains("missing"));
}

TEST_F(SafetensorsTest, HeaderIsPaddedToEightBytes) {
  for (int len = 1; len <= 9; ++len) {
    const std::string p = path("pad" + std::to_string(len) + ".safetensors");
    write_safetensors(p, {{std::string(len, 'w'), Tensor({2}, DType::kF32)}});
    std::ifstream in(p, std::ios::binary);
    uint64_t n = 0;
    in.read(reinterpret_cast<char*>(&n), 8);
    EXPECT_EQ(n % 8, 0u);
    EXPECT_EQ(SafetensorsFile(p).size(), 1u);
  }
}

TEST_F(SafetensorsTest, EmptyTensorsAndEmptyFiles) {
  std::map<std::string, Tensor> tensors;
  tensors["a_empty"] = Tensor({0, 16}, DType::kF32);
  tensors["b"] = random_tensor({4}, DType::kBF16, 7);
  tensors["c_empty"] = Tensor({3, 0}, DType::kF16);
  const std::string p = path("empty.safetensors");
  write_safetensors(p, tensors);
  SafetensorsFile f(p);
  EXPECT_EQ(f.size(), 3u);
  Tensor a = f.tensor("a_empty");
  EXPECT_EQ(a.shape(), (std::vector<int64_t>{0, 16}));
  EXPECT_TRUE(a.empty());
  EXPECT_TRUE(same_bytes(f.tensor("b"), tensors["b"]));
  EXPECT_EQ(f.tensor("c_empty", DType::kF32).shape(), (std::vector<int64_t>{3, 0}));

  // No tensors at all, with and without metadata.
  write_safetensors(path("none.safetensors"), {});
  EXPECT_EQ(SafetensorsFile(path("none.safetensors")).size(), 0u);
  write_safetensors(path("meta.safetensors"), {}, {{"k", "v"}});
  EXPECT_EQ(SafetensorsFile(path("meta.safetensors")).metadata().at("k"), "v");
}

TEST_F(SafetensorsTest, EmptyTensorBetweenTensorsAndUnpaddedHeader) {
  // Hand-written: header not padded, an empty tensor at the boundary of two others.
  const std::string header = R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                             R"("e":{"dtype":"BF16","shape":[0,5],"data_offsets":[8,8]},)"
                             R"("y":{"dtype":"F16","shape":[1],"data_offsets":[8,10]}})";
  SafetensorsFile f(write_file("boundary.safetensors", header, 10));
  EXPECT_EQ(f.entry("e").nbytes(), 0u);
  EXPECT_EQ(f.tensor("y").numel(), 1);
}

TEST_F(SafetensorsTest, OtherDtypesListButDoNotRead) {
  const std::string header = R"({"ids":{"dtype":"I64","shape":[2],"data_offsets":[0,16]},)"
                             R"("w":{"dtype":"F32","shape":[1],"data_offsets":[16,20]}})";
  const std::string p = write_file("i64.safetensors", header, 20);
  SafetensorsFile f(p);
  EXPECT_EQ(f.entry("ids").dtype, "I64");
  EXPECT_FALSE(f.entry("ids").seqpar_dtype().has_value());
  EXPECT_EQ(f.bytes("ids").size(), 16u);
  EXPECT_NO_THROW(f.tensor("w"));
  try {
    f.tensor("ids");
    ADD_FAILURE() << "I64 read as a Tensor";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'ids' has dtype I64"), std::string::npos) << e.what();
  }
}

TEST_F(SafetensorsTest, MoveKeepsTheMapping) {
  const std::string p = path("move.safetensors");
  Tensor t = random_tensor({5, 3}, DType::kF32, 9);
  write_safetensors(p, {{"t", t}});
  SafetensorsFile a(p);
  SafetensorsFile b(std::move(a));
  EXPECT_TRUE(same_bytes(b.tensor("t"), t));
  SafetensorsFile c(p);
  c = std::move(b);
  EXPECT_TRUE(same_bytes(c.tensor("t"), t));
}

// ---- load_checked ----------------------------------------------------------------------------

TEST_F(SafetensorsTest, LoadCheckedConvertsAndChecks) {
  const std::string p = path("weights.safetensors");
  Tensor q = random_tensor({64, 32}, DType::kBF16, 11);
  write_safetensors(p, {{"blocks.0.attn.q.weight", q}, {"blocks.0.attn.k.weight", q}});
  SafetensorsFile f(p);

  Tensor got = load_checked(f, "blocks.0.attn.q.weight", {64, 32}, DType::kF32);
  EXPECT_EQ(got.dtype(), DType::kF32);
  EXPECT_TRUE(same_bytes(got, q.to(DType::kF32)));

  try {
    load_checked(f, "blocks.0.attn.q.weight", {64, 64}, DType::kF32);
    ADD_FAILURE() << "wrong shape accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()),
              p + ": tensor 'blocks.0.attn.q.weight' has shape [64, 32] but the model expects "
                  "[64, 64]");
  }
  try {
    load_checked(f, "blocks.0.attn.v.weight", {64, 32}, DType::kF32);
    ADD_FAILURE() << "missing tensor accepted";
  } catch (const InvalidArgument& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(p + ": no tensor 'blocks.0.attn.v.weight'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("'blocks.0.attn.k.weight'"), std::string::npos) << msg;  // a hint
  }
}

// ---- malformed files --------------------------------------------------------------------------

const char* kOne = R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})";

TEST_F(SafetensorsTest, WellFormedBaselineOpens) {
  EXPECT_EQ(SafetensorsFile(write_file("ok.safetensors", kOne, 16)).size(), 1u);
}

TEST_F(SafetensorsTest, RejectsMissingAndTruncatedFiles) {
  expect_rejected(path("absent.safetensors"), {"cannot open"});
  expect_rejected(write_bytes("zero.safetensors", ""), {"0 bytes", "too short"});
  expect_rejected(write_bytes("five.safetensors", std::string("\x10\0\0\0\0", 5)),
                  {"5 bytes", "too short"});
  // A good file cut inside its data, inside its header, right after the size field.
  const std::string good = path("good.safetensors");
  write_safetensors(good, {{"w", random_tensor({4, 4}, DType::kF32, 1)}});
  std::string bytes(fs::file_size(good), '\0');
  std::ifstream(good, std::ios::binary).read(bytes.data(), bytes.size());
  expect_rejected(write_bytes("cut_data.safetensors", bytes.substr(0, bytes.size() - 4)),
                  {"tensor 'w'", "past the end of the data section"});
  expect_rejected(write_bytes("cut_header.safetensors", bytes.substr(0, 20)),
                  {"header size", "truncated"});
  expect_rejected(write_bytes("cut_size.safetensors", bytes.substr(0, 8)),
                  {"header size", "truncated"});
  expect_rejected(dir_.string(), {"not a regular file"});
}

TEST_F(SafetensorsTest, RejectsOversizedHeader) {
  expect_rejected(write_file("huge.safetensors", kOne, 16, 100'000'001),
                  {"100000001 bytes", "over the limit of 100000000"});
  expect_rejected(write_file("max.safetensors", kOne, 16, int64_t{1} << 62), {"over the limit"});
}

TEST_F(SafetensorsTest, RejectsHeaderSizeBeyondTheFile) {
  const std::string header = kOne;
  expect_rejected(write_file("beyond.safetensors", header, 16, header.size() + 17),
                  {"header size is " + std::to_string(header.size() + 17) + " bytes but only " +
                   std::to_string(header.size() + 16) + " bytes follow"});
}

TEST_F(SafetensorsTest, RejectsBadJson) {
  expect_rejected(write_file("trunc.safetensors", R"({"w":{"dtype":"F32")", 0), {"not valid JSON"});
  expect_rejected(write_file("garbage.safetensors", "\x89PNG\r\n\x1a\n", 0), {"not valid JSON"});
  expect_rejected(write_file("empty.safetensors", "", 0), {"not valid JSON"});
  expect_rejected(write_file("array.safetensors", "[1, 2]", 0), {"not a JSON object"});
  // The size field counts header bytes that are not there as JSON (trailing data bytes).
  expect_rejected(write_file("long.safetensors", std::string(kOne) + "\x01\x01", 14),
                  {"not valid JSON"});
}

TEST_F(SafetensorsTest, RejectsMalformedEntries) {
  expect_rejected(write_file("notobj.safetensors", R"({"w": 3})", 0),
                  {"tensor 'w' is 3", "expected an object"});
  expect_rejected(
      write_file("nodtype.safetensors", R"({"w":{"shape":[1],"data_offsets":[0,4]}})", 4),
      {"tensor 'w' has no 'dtype'"});
  expect_rejected(
      write_file("noshape.safetensors", R"({"w":{"dtype":"F32","data_offsets":[0,4]}})", 4),
      {"tensor 'w' has no 'shape'"});
  expect_rejected(write_file("nooff.safetensors", R"({"w":{"dtype":"F32","shape":[1]}})", 4),
                  {"tensor 'w' has no 'data_offsets'"});
  expect_rejected(write_file("negdim.safetensors",
                             R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4),
                  {"tensor 'w' has shape [-1]", "non-negative"});
  expect_rejected(write_file("floatdim.safetensors",
                             R"({"w":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", 4),
                  {"tensor 'w' has shape [1.5]"});
  expect_rejected(write_file("offlen.safetensors",
                             R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", 4),
                  {"tensor 'w' has data_offsets [0]", "expected [begin, end]"});
  expect_rejected(write_file("offneg.safetensors",
                             R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", 4),
                  {"tensor 'w' has data offset -4"});
  expect_rejected(write_file("backwards.safetensors",
                             R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", 4),
                  {"tensor 'w' has data_offsets [4, 0]", "end before they begin"});
  expect_rejected(
      write_file("huge.safetensors",
                 R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}})",
                 4),
      {"tensor 'w'", "too large"});
  expect_rejected(write_file("meta.safetensors", R"({"__metadata__":{"k":1}})", 0),
                  {"__metadata__ key 'k'", "values are strings"});
  expect_rejected(write_file("meta2.safetensors", R"({"__metadata__":[1]})", 0),
                  {"__metadata__ is [1]"});
}

TEST_F(SafetensorsTest, RejectsUnknownDtype) {
  expect_rejected(
      write_file("q4.safetensors", R"({"w":{"dtype":"Q4_K","shape":[2],"data_offsets":[0,2]}})", 2),
      {"tensor 'w' has unknown dtype 'Q4_K'", "known: ", "BF16"});
  expect_rejected(write_file("lower.safetensors",
                             R"({"w":{"dtype":"f32","shape":[1],"data_offsets":[0,4]}})", 4),
                  {"unknown dtype 'f32'"});
  expect_rejected(
      write_file("num.safetensors", R"({"w":{"dtype":4,"shape":[1],"data_offsets":[0,4]}})", 4),
      {"tensor 'w' has dtype 4"});
}

TEST_F(SafetensorsTest, RejectsDtypeShapeMismatch) {
  const std::string p = write_file(
      "weights.safetensors",
      R"({"blocks.0.attn.q.weight":{"dtype":"F32","shape":[64,64],"data_offsets":[0,8192]}})",
      8192);
  try {
    SafetensorsFile f(p);
    ADD_FAILURE();
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()), p + ": tensor 'blocks.0.attn.q.weight' has shape [64, 64] "
                                         "(16384 bytes as F32) but its byte range is 8192 bytes");
  }
  // The same bytes declared BF16 are right; declared F16 with one row too many are not.
  EXPECT_NO_THROW(SafetensorsFile(
      write_file("bf16.safetensors",
                 R"({"q":{"dtype":"BF16","shape":[64,64],"data_offsets":[0,8192]}})", 8192)));
  expect_rejected(
      write_file("f16.safetensors",
                 R"({"q":{"dtype":"F16","shape":[65,64],"data_offsets":[0,8192]}})", 8192),
      {"tensor 'q' has shape [65, 64] (8320 bytes as F16)", "8192 bytes"});
  // An empty shape with a non-empty range.
  expect_rejected(write_file("empty.safetensors",
                             R"({"e":{"dtype":"F32","shape":[0,4],"data_offsets":[0,4]}})", 4),
                  {"tensor 'e' has shape [0, 4] (0 bytes as F32)"});
}

TEST_F(SafetensorsTest, RejectsOverlappingOffsets) {
  expect_rejected(write_file("overlap.safetensors",
                             R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                             R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                             16),
                  {"tensor 'b' (bytes [8, 16)) overlaps tensor 'a' (bytes [0, 16))"});
  expect_rejected(write_file("same.safetensors",
                             R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                             R"("b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                             8),
                  {"overlaps"});
  // An empty tensor inside another tensor's bytes.
  expect_rejected(write_file("inside.safetensors",
                             R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                             R"("e":{"dtype":"F32","shape":[0],"data_offsets":[8,8]}})",
                             16),
                  {"tensor 'e'", "overlaps tensor 'a'"});
}

TEST_F(SafetensorsTest, RejectsUncoveredBytes) {
  expect_rejected(write_file("gap.safetensors",
                             R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                             R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                             12),
                  {"bytes [4, 8) of the data section belong to no tensor", "'b'"});
  expect_rejected(write_file("lead.safetensors",
                             R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8),
                  {"bytes [0, 4)", "belong to no tensor"});
  expect_rejected(write_file("tail.safetensors", kOne, 20),
                  {"bytes [16, 20) at the end of the data section belong to no tensor"});
  expect_rejected(write_file("nothing.safetensors", "{}", 3),
                  {"bytes [0, 3) at the end of the data section belong to no tensor"});
}

TEST_F(SafetensorsTest, RejectsOffsetsPastTheEnd) {
  expect_rejected(write_file("past.safetensors",
                             R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                             R"("b":{"dtype":"F32","shape":[4],"data_offsets":[16,32]}})",
                             24),
                  {"tensor 'b' has data_offsets [16, 32] past the end of the data section (24 "
                   "bytes)"});
  expect_rejected(write_file("far.safetensors",
                             R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[1000,1000]}})", 0),
                  {"tensor 'a'", "past the end"});
}

TEST_F(SafetensorsTest, RejectsDuplicateNames) {
  expect_rejected(write_file("dup.safetensors",
                             R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                             R"("w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                             8),
                  {"tensor 'w' appears more than once"});
  expect_rejected(write_file("dupkey.safetensors",
                             R"({"w":{"dtype":"F32","dtype":"F16","shape":[1],)"
                             R"("data_offsets":[0,4]}})",
                             4),
                  {"repeats the key 'dtype' inside 'w'"});
}

// ---- untrusted input: nesting depth and quoted values ----------------------------------------

// `depth` nested lists: "[[[...]]]" (200 KB for 100,000).
std::string nested_lists(int depth) { return std::string(depth, '[') + std::string(depth, ']'); }

// A header that nests 100,000 lists once parsed, in the metadata, a dtype or a shape element,
// used to overflow the stack when the error message quoted the value (json::dump recursing).
// It is now rejected before parsing, with one line.
TEST_F(SafetensorsTest, RejectsDeeplyNestedHeaderWithOneLine) {
  const std::string deep = nested_lists(100'000);
  const std::string headers[] = {
      R"({"__metadata__":)" + deep + "}",
      R"({"__metadata__":{"k":)" + deep + "}}",
      R"({"w":{"dtype":)" + deep + R"(,"shape":[1],"data_offsets":[0,4]}})",
      R"({"w":{"dtype":"F32","shape":[1,)" + deep + R"(],"data_offsets":[0,4]}})",
  };
  int i = 0;
  for (const std::string& header : headers) {
    const std::string p = write_file("deep" + std::to_string(i++) + ".safetensors", header, 4);
    expect_rejected(p, {"nests arrays and objects deeper than 64 levels"});
    try {
      SafetensorsFile f(p);
    } catch (const InvalidArgument& e) {
      EXPECT_LT(std::strlen(e.what()), p.size() + 120) << e.what();
    }
  }
  // Nesting up to the limit is only a wrong value, reported with a short quote.
  expect_rejected(
      write_file("deep64.safetensors", R"({"__metadata__":)" + nested_lists(63) + "}", 0),
      {"__metadata__ is [[[[", "...; expected an object of strings"});
}

// Names, strings and shapes from the header can be megabytes long: messages quote them cut to a
// fixed length.
TEST_F(SafetensorsTest, QuotesLongValuesShort) {
  const std::string long_name(1 << 20, 'n');
  const std::string cases[] = {
      R"({")" + long_name + R"(":{"dtype":"F32","shape":[1],"data_offsets":[0,8]}})",
      R"({"w":{"dtype":")" + long_name + R"(","shape":[1],"data_offsets":[0,4]}})",
      R"({"w":{"dtype":"F32","shape":")" + long_name + R"(","data_offsets":[0,4]}})",
      R"({"__metadata__":{")" + long_name + R"(":1}})",
  };
  std::string dims = "[1";
  for (int d = 0; d < 100'000; ++d) dims += ",1";
  int i = 0;
  for (const std::string& header :
       {cases[0], cases[1], cases[2], cases[3],
        R"({"w":{"dtype":"F32","shape":)" + dims + R"(],"data_offsets":[0,8]}})"}) {
    const std::string p = write_file("long" + std::to_string(i++) + ".safetensors", header, 8);
    try {
      SafetensorsFile f(p);
      ADD_FAILURE() << p << " was accepted";
    } catch (const InvalidArgument& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.find('\n'), std::string::npos);
      EXPECT_LT(msg.size(), p.size() + 300) << msg.substr(0, 400);
      EXPECT_NE(msg.find("..."), std::string::npos) << msg.substr(0, 400);
    }
  }
}

// The in-memory reader (SafetensorsFile and the fuzz target both use it) sees what the file sees.
TEST_F(SafetensorsTest, ParsesFromMemory) {
  const std::string p = path("mem.safetensors");
  write_safetensors(p, {{"a", random_tensor({2, 3}, DType::kBF16, 1)}}, {{"k", "v"}});
  std::ifstream in(p, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const SafetensorsHeader h =
      parse_safetensors({reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()}, "memory");
  const SafetensorsFile f(p);
  ASSERT_EQ(h.entries.size(), 1u);
  EXPECT_EQ(h.entries[0].name, "a");
  EXPECT_EQ(h.entries[0].shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(h.metadata, f.metadata());
  EXPECT_EQ(h.data_offset + h.entries[0].nbytes(), bytes.size());
  EXPECT_THROW(parse_safetensors({}, "memory"), InvalidArgument);
}

TEST_F(SafetensorsTest, WriterRejectsReservedName) {
  EXPECT_THROW(write_safetensors(path("r.safetensors"), {{"__metadata__", Tensor({1})}}),
               InvalidArgument);
  EXPECT_THROW(write_safetensors((dir_ / "no" / "such" / "dir.st").string(), {}), Error);
}

}  // namespace
}  // namespace seqpar

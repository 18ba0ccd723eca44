// Safetensors: bitwise round-trips for every dtype and layout, byte-exact checks against hand-built files
// (so the writer is not only tested against our own reader), and one CheckpointError per kind of corruption.
#include "cohort/checkpoint/Safetensors.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

#include "cohort/util/Error.h"

namespace fs = std::filesystem;
namespace ck = cohort::checkpoint;

namespace {

// u64 little-endian length, then the header, then the data, assembled byte by byte without our writer.
std::string make_file(const std::string& header, const std::string& data, std::uint64_t length) {
  std::string out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((length >> (8 * i)) & 0xff));
  return out + header + data;
}
std::string make_file(const std::string& header, const std::string& data = {}) {
  return make_file(header, data, header.size());
}

bool bitwise_equal(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  at::Tensor ca = a.contiguous(), cb = b.contiguous();
  const std::size_t n = ca.numel() * ca.element_size();
  return n == 0 || std::memcmp(ca.data_ptr(), cb.data_ptr(), n) == 0;
}

at::Tensor sample(at::ScalarType type, at::IntArrayRef shape) {
  if (at::isFloatingType(type)) return at::randn(shape, at::kDouble).mul(100).to(type);
  if (type == at::kBool) return at::randint(0, 2, shape, at::kLong).to(at::kBool);
  if (type == at::kByte) return at::randint(0, 256, shape, at::kLong).to(at::kByte);
  if (type == at::kLong) return at::randint(-(1ll << 62), 1ll << 62, shape, at::kLong);
  return at::randint(-100, 100, shape, at::kLong).to(type);
}

const std::vector<std::pair<const char*, at::ScalarType>> kAllDtypes = {
    {"F64", at::kDouble}, {"F32", at::kFloat}, {"F16", at::kHalf}, {"BF16", at::kBFloat16}, {"I64", at::kLong},
    {"I32", at::kInt},    {"I16", at::kShort}, {"I8", at::kChar},  {"U8", at::kByte},       {"BOOL", at::kBool}};

// Full, transposed, strided, 0-d and empty tensors of every dtype, in an order that is not alphabetical.
ck::NamedTensors every_kind() {
  at::manual_seed(7);
  ck::NamedTensors out;
  for (const auto& [name, type] : kAllDtypes) {
    at::Tensor base = sample(type, {3, 4});
    std::string n = name;
    out.emplace_back(n + ".full", base);
    out.emplace_back(n + ".transposed", sample(type, {5, 3}).t());
    out.emplace_back(n + ".strided", sample(type, {4, 6}).slice(1, 0, 6, 2));
    out.emplace_back(n + ".scalar", sample(type, {}));
    out.emplace_back(n + ".empty", sample(type, {0, 5}));
  }
  // Values whose bits a float conversion could change.
  out.emplace_back("a.special", at::tensor({std::nan(""), -0.0, INFINITY, -INFINITY, 5e-324}, at::kDouble));
  out.emplace_back("b.special_f32", at::tensor({NAN, -0.0f, INFINITY, 1e-45f}, at::kFloat));
  return out;
}

void expect_same(const ck::NamedTensors& expected, const ck::NamedTensors& actual) {
  ASSERT_EQ(expected.size(), actual.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(expected[i].first, actual[i].first) << "position " << i;
    EXPECT_TRUE(bitwise_equal(expected[i].second, actual[i].second)) << expected[i].first;
    EXPECT_TRUE(actual[i].second.is_contiguous());
    EXPECT_EQ(actual[i].second.device().type(), at::kCPU);
  }
}

class SafetensorsFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / ("cohort_st_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST(Safetensors, RoundTripEveryDtypeInMemory) {
  const ck::NamedTensors tensors = every_kind();
  ck::SafetensorsFile f;
  {
    // The bytes go out of scope before the tensors are checked: loaded tensors must own their memory.
    std::string bytes = ck::to_safetensors_bytes(tensors, {});
    f = ck::from_safetensors_bytes(bytes, "mem");
  }
  expect_same(tensors, f.tensors);
  // Only the checksum cohort adds to every file (Note [Checkpoint checksums]).
  ASSERT_EQ(f.metadata.size(), 1u);
  EXPECT_EQ(f.metadata.begin()->first, "cohort.crc32c");
}

TEST_F(SafetensorsFileTest, RoundTripThroughFile) {
  const ck::NamedTensors tensors = every_kind();
  const std::map<std::string, std::string> meta = {
      {"format", "pt"}, {"step", "1200"}, {"empty", ""}, {"unicode", "h\xc3\xa9llo \xe2\x9c\x93"}};
  const fs::path path = dir_ / "all.safetensors";
  ck::save_safetensors(path, tensors, meta);
  ck::SafetensorsFile f = ck::load_safetensors(path);
  expect_same(tensors, f.tensors);
  EXPECT_EQ(f.metadata.erase("cohort.crc32c"), 1u);
  EXPECT_EQ(f.metadata, meta);
  EXPECT_EQ(fs::file_size(path), ck::to_safetensors_bytes(tensors, meta).size());
}

TEST_F(SafetensorsFileTest, AFlippedDataBitIsCaughtByTheChecksum) {
  const fs::path path = dir_ / "flip.safetensors";
  ck::save_safetensors(path, {{"w", at::arange(1000, at::kFloat)}}, {{"step", "3"}});
  std::string bytes = std::string(std::istreambuf_iterator<char>(std::ifstream(path, std::ios::binary).rdbuf()), {});
  bytes[bytes.size() - 100] ^= 0x04;  // inside w's data, far from the header
  std::ofstream(path, std::ios::binary) << bytes;
  try {
    ck::load_safetensors(path);
    FAIL() << "a damaged file loaded";
  } catch (const cohort::CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("is damaged: its data has CRC-32C"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos) << e.what();
  }
}

TEST(Safetensors, HeaderPaddedToMultipleOf8WithSpaces) {
  for (int len = 1; len <= 9; ++len) {
    const std::string name(len, 'n');
    std::string bytes = ck::to_safetensors_bytes({{name, at::ones({len}, at::kByte)}}, {});
    std::uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= static_cast<std::uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
    EXPECT_EQ(n % 8, 0u) << name;
    ASSERT_EQ(bytes.size(), 8 + n + len);
    const std::string header = bytes.substr(8, n);
    const std::size_t close = header.find_last_of('}');
    EXPECT_EQ(header.find_first_not_of(' ', close + 1), std::string::npos) << header;
    EXPECT_LT(n - close - 1, 8u);
  }
}

TEST(Safetensors, WriterMatchesHandBuiltBytes) {
  // 1.0f and -2.0f as IEEE-754 little-endian. The metadata always carries the data's CRC-32C (Note
  // [Checkpoint checksums]); 0xaa36f2c9 for these 8 bytes was computed independently, bit by bit, in Python.
  const std::string data("\x00\x00\x80\x3f\x00\x00\x00\xc0", 8);
  const std::string header =
      R"({"__metadata__":{"cohort.crc32c":"aa36f2c9"},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})" +
      std::string(6, ' ');  // 98 bytes of JSON, 6 of padding
  ASSERT_EQ(header.size() % 8, 0u);
  EXPECT_EQ(ck::to_safetensors_bytes({{"w", at::tensor({1.0f, -2.0f})}}, {}), make_file(header, data));

  const std::string with_meta =
      R"({"__metadata__":{"cohort.crc32c":"aa36f2c9","step":"7"},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})" +
      std::string(3, ' ');  // 109 bytes of JSON, 3 of padding
  ASSERT_EQ(with_meta.size() % 8, 0u);
  EXPECT_EQ(ck::to_safetensors_bytes({{"w", at::tensor({1.0f, -2.0f})}}, {{"step", "7"}}), make_file(with_meta, data));
}

TEST(Safetensors, ReadsForeignFileInOffsetOrder) {
  // Another writer's style: metadata first, keys in another order, whitespace, header order != data order.
  const std::string header = R"({ "__metadata__": {"format": "pt"},
      "b": {"shape": [3], "dtype": "I16", "data_offsets": [4, 10]},
      "a": {"data_offsets": [0, 4], "dtype": "BF16", "shape": [2]} })";
  const std::string data(
      "\x80\x3f\x00\xc0"
      "\x01\x00\xff\xff\x00\x01",
      10);
  ck::SafetensorsFile f = ck::from_safetensors_bytes(make_file(header, data), "foreign.safetensors");
  ASSERT_EQ(f.tensors.size(), 2u);
  EXPECT_EQ(f.tensors[0].first, "a");
  EXPECT_EQ(f.tensors[1].first, "b");
  EXPECT_TRUE(bitwise_equal(f.tensors[0].second, at::tensor({1.0f, -2.0f}).to(at::kBFloat16)));
  EXPECT_TRUE(bitwise_equal(f.tensors[1].second, at::tensor({1, -1, 256}, at::kShort)));
  EXPECT_EQ(f.metadata.at("format"), "pt");
}

TEST(Safetensors, EmptyFileAndEmptyTensorsKeepOrder) {
  ck::SafetensorsFile none = ck::from_safetensors_bytes(ck::to_safetensors_bytes({}, {}), "none");
  EXPECT_TRUE(none.tensors.empty());
  // Empty tensors share an offset with their neighbours; the header order must decide.
  ck::NamedTensors t = {{"z", at::empty({0}, at::kFloat)},
                        {"y", at::ones({2}, at::kFloat)},
                        {"x", at::empty({0, 3}, at::kInt)},
                        {"w", at::empty({0}, at::kByte)},
                        {"v", at::ones({1}, at::kChar)}};
  expect_same(t, ck::from_safetensors_bytes(ck::to_safetensors_bytes(t, {}), "e").tensors);
}

TEST(Safetensors, WriterRejectsBadInput) {
  EXPECT_THROW(ck::to_safetensors_bytes({{"c", at::zeros({2}, at::kComplexFloat)}}, {}), cohort::CheckpointError);
  EXPECT_THROW(ck::to_safetensors_bytes({{"a", at::ones({1})}, {"a", at::ones({1})}}, {}), cohort::CheckpointError);
  EXPECT_THROW(ck::to_safetensors_bytes({{"__metadata__", at::ones({1})}}, {}), cohort::CheckpointError);
  EXPECT_THROW(ck::to_safetensors_bytes({{"u", at::Tensor()}}, {}), cohort::CheckpointError);
}

TEST_F(SafetensorsFileTest, SaveIntoMissingDirectoryNamesPath) {
  const fs::path path = dir_ / "missing" / "m.safetensors";
  try {
    ck::save_safetensors(path, {{"a", at::ones({2})}});
    FAIL() << "expected CheckpointError";
  } catch (const cohort::CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos) << e.what();
  }
}

TEST_F(SafetensorsFileTest, FailedSaveKeepsPreviousFile) {
  const fs::path path = dir_ / "m.safetensors";
  ck::save_safetensors(path, {{"a", at::ones({2})}});
  EXPECT_THROW(ck::save_safetensors(path, {{"a", at::zeros({2})}, {"c", at::zeros({1}, at::kComplexDouble)}}),
               cohort::CheckpointError);
  EXPECT_TRUE(bitwise_equal(ck::load_safetensors(path).tensors.at(0).second, at::ones({2})));
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1);
}

TEST_F(SafetensorsFileTest, LoadErrorsNameTheFile) {
  const fs::path missing = dir_ / "absent.safetensors";
  try {
    ck::load_safetensors(missing);
    FAIL();
  } catch (const cohort::CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find(missing.string()), std::string::npos) << e.what();
  }
  // A real checkpoint cut short on disk.
  const fs::path cut = dir_ / "cut.safetensors";
  std::string bytes = ck::to_safetensors_bytes({{"a", at::ones({16})}}, {});
  std::ofstream(cut, std::ios::binary) << bytes.substr(0, bytes.size() - 3);
  try {
    ck::load_safetensors(cut);
    FAIL();
  } catch (const cohort::CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find(cut.string()), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("run past"), std::string::npos) << e.what();
  }
}

struct Corruption {
  const char* label;
  std::string bytes;
  const char* expect;  // a phrase the message must contain
};

std::string entry(const std::string& name, const std::string& dtype, const std::string& shape,
                  const std::string& offsets) {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":" + offsets + "}";
}

TEST(Safetensors, EveryCorruptionIsCheckpointErrorNamingFile) {
  const std::string d8(8, '\x01'), d12(12, '\x01');
  const std::string a = entry("a", "F32", "[2]", "[0,8]");
  const std::vector<Corruption> cases = {
      {"shorter than 8 bytes", std::string("\x05\x00\x00", 3), "shorter than the 8-byte"},
      {"header longer than file", make_file("{}", "", 1000), "larger than"},
      {"header over the cap", make_file("{}", "", 200'000'000), "cap"},
      {"JSON does not parse", make_file("{\"a\": {"), "not valid JSON"},
      {"JSON not an object", make_file("[1,2]"), "not a JSON object"},
      {"entry not an object", make_file(R"({"a": 3})"), "not a JSON object"},
      {"missing dtype", make_file(R"({"a":{"shape":[2],"data_offsets":[0,8]}})", d8), "no \"dtype\""},
      {"missing shape", make_file(R"({"a":{"dtype":"F32","data_offsets":[0,8]}})", d8), "no \"shape\""},
      {"missing data_offsets", make_file(R"({"a":{"dtype":"F32","shape":[2]}})", d8), "no \"data_offsets\""},
      {"unknown dtype", make_file("{" + entry("a", "C64", "[1]", "[0,8]") + "}", d8), "dtype 'C64'"},
      {"negative dim", make_file("{" + entry("a", "F32", "[-2]", "[0,8]") + "}", d8), "non-negative integer"},
      {"float dim", make_file("{" + entry("a", "F32", "[2.0]", "[0,8]") + "}", d8), "non-negative integer"},
      {"one offset", make_file("{" + entry("a", "F32", "[2]", "[8]") + "}", d8), "two non-negative"},
      {"end before begin", make_file("{" + entry("a", "U8", "[0]", "[8,0]") + "}", d8), "end before"},
      {"size != shape", make_file("{" + entry("a", "F32", "[3]", "[0,8]") + "}", d8), "needs 12"},
      {"shape overflows", make_file("{" + entry("a", "F32", "[4611686018427387904,8]", "[0,8]") + "}", d8),
       "more than 2^64"},
      {"offsets out of range", make_file("{" + a + "}", std::string(4, '\0')), "run past"},
      {"overlap", make_file("{" + a + "," + entry("b", "F32", "[2]", "[4,12]") + "}", d12), "overlap"},
      {"hole", make_file("{" + entry("a", "F32", "[1]", "[0,4]") + "," + entry("b", "F32", "[1]", "[8,12]") + "}", d12),
       "hole"},
      {"first tensor not at 0", make_file("{" + entry("a", "F32", "[1]", "[4,8]") + "}", d8), "hole"},
      {"trailing bytes", make_file("{" + a + "}", d12), "belong to no tensor"},
      {"duplicate names", make_file("{" + a + "," + a + "}", d8), "'a' twice"},
      {"metadata not strings", make_file(R"({"__metadata__":{"step":7}})"), "not a string"},
      {"metadata not an object", make_file(R"({"__metadata__":[1]})"), "not a JSON object"},
  };
  for (const Corruption& c : cases) {
    try {
      ck::from_safetensors_bytes(c.bytes, "broken.safetensors");
      ADD_FAILURE() << c.label << ": no error";
    } catch (const cohort::CheckpointError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("broken.safetensors"), std::string::npos) << c.label << ": " << msg;
      EXPECT_NE(msg.find(c.expect), std::string::npos) << c.label << ": " << msg;
    } catch (const std::exception& e) {
      ADD_FAILURE() << c.label << ": wrong exception type: " << e.what();
    }
  }
}

TEST(Safetensors, SavesCudaTensors) {
  if (!at::hasCUDA()) {
    GTEST_SKIP() << "no CUDA in this LibTorch build or no GPU";
  }
  ck::NamedTensors gpu = {{"g", at::randn({4, 5}).to(at::kCUDA).t()}};
  ck::SafetensorsFile f = ck::from_safetensors_bytes(ck::to_safetensors_bytes(gpu, {}), "gpu");
  EXPECT_TRUE(bitwise_equal(f.tensors.at(0).second, gpu[0].second.cpu()));
}

}  // namespace

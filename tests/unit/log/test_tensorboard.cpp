// TensorBoard event files: CRC-32C known answers, the exact bytes of an encoded scalar event, and a
// written file read back record by record with both checksums verified.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>

#include "cohort/log/TensorBoard.h"

namespace fs = std::filesystem;
using namespace cohort::log;

namespace {

std::string hex(const std::string& s) {
  static const char* d = "0123456789abcdef";
  std::string out;
  for (unsigned char c : s) {
    out += d[c >> 4];
    out += d[c & 15];
  }
  return out;
}

template <class T>
T read_le(const std::string& s, size_t at) {
  T v;
  std::memcpy(&v, s.data() + at, sizeof v);
  return v;
}

// Splits a TFRecord file into its records, checking both CRCs of each.
std::vector<std::string> read_records(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  const std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> out;
  size_t at = 0;
  while (at < all.size()) {
    EXPECT_LE(at + 12, all.size());
    const auto len = read_le<uint64_t>(all, at);
    EXPECT_EQ(read_le<uint32_t>(all, at + 8), masked_crc32c(all.data() + at, 8));
    const std::string data = all.substr(at + 12, len);
    EXPECT_EQ(read_le<uint32_t>(all, at + 12 + len), masked_crc32c(data.data(), data.size()));
    out.push_back(data);
    at += 12 + len + 4;
  }
  return out;
}

}  // namespace

TEST(TensorBoard, Crc32cKnownAnswers) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);  // the CRC-32C check value
  EXPECT_EQ(crc32c("", 0), 0u);
  const uint32_t c = crc32c("123456789", 9);
  EXPECT_EQ(masked_crc32c("123456789", 9), ((c >> 15) | (c << 17)) + 0xA282EAD8u);
}

TEST(TensorBoard, ScalarEventBytesAreTheProtobufEncoding) {
  // Event{wall_time=1.0, step=300, summary{value{tag="a", simple_value=0.5}}}, encoded by hand:
  // 09 <1.0 as LE double> | 10 ac 02 (300 as varint) | 2a 0a { 0a 08 { 0a 01 'a' | 15 <0.5 as LE float> } }
  const std::string expected_hex =
      "09000000000000f03f"
      "10ac02"
      "2a0a"
      "0a08"
      "0a0161"
      "150000003f";
  EXPECT_EQ(hex(encode_scalar_event(1.0, 300, "a", 0.5f)), expected_hex);
  EXPECT_EQ(hex(encode_file_version_event(0.0, "brain.Event:2")),
            "090000000000000000"
            "1a0d" +
                hex("brain.Event:2"));
}

TEST(TensorBoard, WrittenFileReadsBackRecordByRecord) {
  const auto dir = fs::temp_directory_path() / ("cohort-tb-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::path file;
  {
    EventWriter tb(dir);
    file = tb.path();
    tb.add_scalar("train/loss", 2.5, 1);
    tb.add_scalar("val/top1", 0.75, 2);
  }
  EXPECT_EQ(file.filename().string().rfind("events.out.tfevents.", 0), 0u) << file;
  const auto records = read_records(file);
  ASSERT_EQ(records.size(), 3u);
  EXPECT_NE(records[0].find("brain.Event:2"), std::string::npos);
  // Each scalar record is exactly the encoding of its event, apart from the wall time (bytes 1..8).
  auto expect_scalar = [](const std::string& rec, int64_t step, const std::string& tag, float v) {
    auto want = encode_scalar_event(0.0, step, tag, v);
    ASSERT_EQ(rec.size(), want.size());
    EXPECT_EQ(rec.substr(9), want.substr(9)) << tag;
    EXPECT_GT(read_le<double>(rec, 1), 1.7e9);  // a wall time in seconds since 1970
  };
  expect_scalar(records[1], 1, "train/loss", 2.5f);
  expect_scalar(records[2], 2, "val/top1", 0.75f);
  fs::remove_all(dir);
}

TEST(TensorBoard, UnwritableDirectoryIsNamed) {
  try {
    EventWriter tb("/nonexistent-cohort-dir");
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent-cohort-dir"), std::string::npos) << e.what();
  }
}

// An independent decoder: Debian's protoc reads each record as a protobuf message without our schema,
// so tags, steps and float bits are checked by code we did not write.
TEST(TensorBoard, ProtocDecodesEveryRecord) {
  if (std::system("command -v protoc > /dev/null 2>&1") != 0) {
    GTEST_SKIP() << "protoc is not installed (Debian package protobuf-compiler; `make test` installs it)";
  }
  const auto dir = fs::temp_directory_path() / ("cohort-tb-protoc-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::path file;
  {
    EventWriter tb(dir);
    file = tb.path();
    tb.add_scalar("train/loss", 2.5, 300);  // 2.5f = 0x40200000
    tb.add_scalar("val/top1", 0.5, 301);    // 0.5f = 0x3f000000
  }
  const auto records = read_records(file);
  ASSERT_EQ(records.size(), 3u);
  auto decode = [&](const std::string& rec) {
    const auto in = dir / "record.bin", out = dir / "decoded.txt";
    std::ofstream(in, std::ios::binary) << rec;
    EXPECT_EQ(std::system(("protoc --decode_raw < " + in.string() + " > " + out.string()).c_str()), 0);
    std::ifstream f(out);
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  };
  const std::string first = decode(records[0]);
  EXPECT_NE(first.find("3: \"brain.Event:2\""), std::string::npos) << first;
  const std::string loss = decode(records[1]);
  // Event.step is field 2, Event.summary field 5 > Summary.value field 1 > Value.tag 1, simple_value 2.
  EXPECT_NE(loss.find("2: 300\n"), std::string::npos) << loss;
  EXPECT_NE(loss.find("5 {"), std::string::npos) << loss;
  EXPECT_NE(loss.find("1: \"train/loss\""), std::string::npos) << loss;
  EXPECT_NE(loss.find("2: 0x40200000"), std::string::npos) << loss;
  const std::string top1 = decode(records[2]);
  EXPECT_NE(top1.find("2: 301\n"), std::string::npos) << top1;
  EXPECT_NE(top1.find("1: \"val/top1\""), std::string::npos) << top1;
  EXPECT_NE(top1.find("2: 0x3f000000"), std::string::npos) << top1;
  fs::remove_all(dir);
}

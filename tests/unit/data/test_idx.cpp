// IDX reading and Fashion-MNIST loading: round trips through small files written here, raw and gzipped,
// every malformed-file error naming the file, and the real dataset when it is installed.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "cohort/data/FashionMnist.h"
#include "cohort/data/Idx.h"
#include "cohort/util/Error.h"

namespace fs = std::filesystem;
using cohort::DataError;
using cohort::data::IdxArray;
using cohort::data::ImageDataset;
using cohort::data::load_fashion_mnist;
using cohort::data::read_idx;

namespace {

using Bytes = std::vector<uint8_t>;

// A uint8 IDX file: header for `dims`, then `payload` (which tests make too short or too long on purpose).
Bytes idx_bytes(const std::vector<uint32_t>& dims, const Bytes& payload, uint8_t type = 0x08) {
  Bytes out = {0, 0, type, static_cast<uint8_t>(dims.size())};
  for (uint32_t d : dims) {
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<uint8_t>(d >> shift));
  }
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

Bytes counting(size_t n, int start = 0) {
  Bytes b(n);
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<uint8_t>((start + i) % 256);
  return b;
}

void write_raw(const fs::path& path, const Bytes& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(f.good()) << path;
}

void write_gz(const fs::path& path, const Bytes& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  if (!bytes.empty()) {
    ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
  }
  ASSERT_EQ(gzclose(f), Z_OK);
}

Bytes read_all(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// Expects read_idx (or any loader) to throw DataError whose message names `path` and contains `needle`.
template <typename Fn>
void expect_data_error(Fn&& fn, const fs::path& path, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "expected DataError for " << path;
  } catch (const DataError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(path.string()), std::string::npos) << "message does not name the file: " << what;
    EXPECT_NE(what.find(needle), std::string::npos) << "message lacks '" << needle << "': " << what;
    EXPECT_FALSE(e.hint().empty()) << what;
  }
}

// Each test's files in a directory of its own, and its inflated copies (Note [An inflated copy of a gzipped
// IDX file] in data/Idx.cpp) in a cache of its own there, not the user's.
class IdxTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("cohort_test_idx_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    if (const char* was = std::getenv("COHORT_CACHE")) cache_was_ = was;
    ::setenv("COHORT_CACHE", (dir_ / "cache").c_str(), 1);
  }
  void TearDown() override {
    if (cache_was_)
      ::setenv("COHORT_CACHE", cache_was_->c_str(), 1);
    else
      ::unsetenv("COHORT_CACHE");
    fs::remove_all(dir_);
  }
  // The inflated copies in this test's cache.
  std::vector<fs::path> copies() const {
    std::vector<fs::path> out;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir_ / "cache" / "idx", ec)) out.push_back(e.path());
    return out;
  }
  fs::path dir_;
  std::optional<std::string> cache_was_;
};

}  // namespace

TEST_F(IdxTest, RoundTripRawAndGzip) {
  const Bytes payload = counting(2 * 3 * 4, 7);
  const Bytes file = idx_bytes({2, 3, 4}, payload);
  for (bool gz : {false, true}) {
    const fs::path p = dir_ / (gz ? "a-idx3-ubyte.gz" : "a-idx3-ubyte");
    if (gz)
      write_gz(p, file);
    else
      write_raw(p, file);
    const IdxArray a = read_idx(p);
    EXPECT_EQ(a.dims, (std::vector<int64_t>{2, 3, 4}));
    ASSERT_EQ(a.data.scalar_type(), at::kByte);
    EXPECT_EQ(a.data.sizes(), (at::IntArrayRef{2, 3, 4}));
    EXPECT_TRUE(a.data.is_contiguous());
    const uint8_t* d = a.data.data_ptr<uint8_t>();
    for (size_t i = 0; i < payload.size(); ++i) EXPECT_EQ(d[i], payload[i]) << "byte " << i << (gz ? " gz" : " raw");
    EXPECT_EQ(a.data[1][2][3].item<uint8_t>(), payload[1 * 12 + 2 * 4 + 3]);
  }
}

TEST_F(IdxTest, OneDimensionalAndLarger) {
  // Larger than one zlib buffer so the chunked read path is exercised.
  const Bytes payload = counting(300000, 3);
  const fs::path p = dir_ / "big.gz";
  write_gz(p, idx_bytes({300000}, payload));
  const IdxArray a = read_idx(p);
  ASSERT_EQ(a.dims, (std::vector<int64_t>{300000}));
  EXPECT_EQ(a.data[299999].item<uint8_t>(), payload[299999]);
}

TEST_F(IdxTest, MissingFileAndDirectory) {
  expect_data_error([&] { read_idx(dir_ / "nope"); }, dir_ / "nope", "does not exist");
  expect_data_error([&] { read_idx(dir_); }, dir_, "directory");
}

TEST_F(IdxTest, WrongMagic) {
  Bytes file = idx_bytes({4}, counting(4));
  file[0] = 0x12;
  for (bool gz : {false, true}) {
    const fs::path p = dir_ / (gz ? "magic.gz" : "magic");
    if (gz)
      write_gz(p, file);
    else
      write_raw(p, file);
    expect_data_error([&] { read_idx(p); }, p, "magic");
  }
}

TEST_F(IdxTest, WrongTypeIsNamed) {
  const fs::path p = dir_ / "float-idx1";
  write_raw(p, idx_bytes({4}, Bytes(16, 0), 0x0D));
  expect_data_error([&] { read_idx(p); }, p, "0x0D (float32)");
}

TEST_F(IdxTest, BadDimensionCount) {
  const fs::path p0 = dir_ / "ndim0";
  write_raw(p0, idx_bytes({}, {}));
  expect_data_error([&] { read_idx(p0); }, p0, "0 dimensions");
  const fs::path p5 = dir_ / "ndim5";
  write_raw(p5, idx_bytes({1, 1, 1, 1, 1}, {1}));
  expect_data_error([&] { read_idx(p5); }, p5, "5 dimensions");
}

TEST_F(IdxTest, ZeroDimension) {
  for (bool gz : {false, true}) {
    const fs::path p = dir_ / (gz ? "zero.gz" : "zero");
    if (gz)
      write_gz(p, idx_bytes({3, 0, 2}, {}));
    else
      write_raw(p, idx_bytes({3, 0, 2}, {}));
    expect_data_error([&] { read_idx(p); }, p, "dimension 1 of 3 is 0");
  }
}

TEST_F(IdxTest, AbsurdSizeIsRefusedBeforeAllocating) {
  const fs::path p = dir_ / "huge";
  write_raw(p, idx_bytes({0xFFFFFFFFu, 0xFFFFFFFFu}, counting(8)));
  expect_data_error([&] { read_idx(p); }, p, "2^34");
}

TEST_F(IdxTest, TruncatedData) {
  for (bool gz : {false, true}) {
    const fs::path p = dir_ / (gz ? "short.gz" : "short");
    const Bytes file = idx_bytes({10, 10}, counting(93));
    if (gz)
      write_gz(p, file);
    else
      write_raw(p, file);
    expect_data_error([&] { read_idx(p); }, p, "file ends after 93 of 100");
  }
}

TEST_F(IdxTest, TruncatedHeader) {
  const fs::path p = dir_ / "hdr";
  write_raw(p, {0, 0});
  expect_data_error([&] { read_idx(p); }, p, "too short");
  const fs::path q = dir_ / "dims";
  write_raw(q, {0, 0, 8, 3, 0, 0, 0, 5});
  expect_data_error([&] { read_idx(q); }, q, "dimension sizes");
}

TEST_F(IdxTest, TrailingBytes) {
  for (bool gz : {false, true}) {
    const fs::path p = dir_ / (gz ? "long.gz" : "long");
    const Bytes file = idx_bytes({2, 5}, counting(17));
    if (gz)
      write_gz(p, file);
    else
      write_raw(p, file);
    expect_data_error([&] { read_idx(p); }, p, "has 7 extra bytes");
  }
}

TEST_F(IdxTest, CorruptGzip) {
  const fs::path good = dir_ / "good.gz";
  write_gz(good, idx_bytes({64, 64}, counting(64 * 64)));
  Bytes gz = read_all(good);
  ASSERT_GT(gz.size(), 40u);

  // Garbage in the middle of the deflate data: zlib reports a data error or a CRC mismatch.
  Bytes scrambled = gz;
  for (size_t i = 15; i < scrambled.size() - 12; ++i) scrambled[i] ^= 0x5A;
  const fs::path p = dir_ / "scrambled.gz";
  write_raw(p, scrambled);
  expect_data_error([&] { read_idx(p); }, p, "");

  // A wrong CRC alone: every byte decompresses, only the trailer check can catch it.
  Bytes bad_crc = gz;
  bad_crc[bad_crc.size() - 8] ^= 0xFF;
  const fs::path c = dir_ / "crc.gz";
  write_raw(c, bad_crc);
  expect_data_error([&] { read_idx(c); }, c, "gzip stream is corrupt");

  // The compressed file cut in half: the stream ends early.
  Bytes half(gz.begin(), gz.begin() + static_cast<std::ptrdiff_t>(gz.size() / 2));
  const fs::path h = dir_ / "half.gz";
  write_raw(h, half);
  expect_data_error([&] { read_idx(h); }, h, "");

  // Only the 8-byte trailer missing: all data arrives, then the stream has no end.
  Bytes no_trailer(gz.begin(), gz.end() - 8);
  const fs::path t = dir_ / "notrailer.gz";
  write_raw(t, no_trailer);
  expect_data_error([&] { read_idx(t); }, t, "cut short");
}

// --- load_fashion_mnist on small synthetic files ---

TEST_F(IdxTest, LoadsSyntheticSplitWithAndWithoutGz) {
  const Bytes pixels = counting(5 * 3 * 4);
  write_gz(dir_ / "t10k-images-idx3-ubyte.gz", idx_bytes({5, 3, 4}, pixels));
  write_raw(dir_ / "t10k-labels-idx1-ubyte", idx_bytes({5}, {9, 0, 3, 3, 1}));
  const ImageDataset ds = load_fashion_mnist(dir_, /*train=*/false);
  EXPECT_EQ(ds.images.sizes(), (at::IntArrayRef{5, 1, 3, 4}));
  EXPECT_EQ(ds.images.scalar_type(), at::kByte);
  EXPECT_EQ(ds.labels.scalar_type(), at::kLong);
  EXPECT_EQ(ds.labels[0].item<int64_t>(), 9);
  EXPECT_EQ(ds.images[4][0][2][3].item<uint8_t>(), pixels[4 * 12 + 2 * 4 + 3]);
  EXPECT_EQ(ds.num_classes, 10);
  EXPECT_FLOAT_EQ(ds.mean, 0.2860f);
  EXPECT_FLOAT_EQ(ds.std, 0.3530f);
  EXPECT_EQ(ds.size(), 5);

  const ImageDataset few = load_fashion_mnist(dir_, false, /*limit=*/2);
  EXPECT_EQ(few.images.size(0), 2);
  EXPECT_EQ(few.labels.size(0), 2);
  EXPECT_TRUE(at::equal(few.images, ds.images.narrow(0, 0, 2)));
  EXPECT_EQ(load_fashion_mnist(dir_, false, /*limit=*/100).size(), 5);
}

TEST_F(IdxTest, LoadErrors) {
  expect_data_error([&] { load_fashion_mnist(dir_ / "absent", true); }, dir_ / "absent", "does not exist");
  try {
    load_fashion_mnist(dir_ / "absent", true);
  } catch (const DataError& e) {
    EXPECT_NE(e.hint().find("apt-get install dataset-fashion-mnist"), std::string::npos);
    EXPECT_NE(e.hint().find("data.root="), std::string::npos);
  }
  expect_data_error([&] { load_fashion_mnist(dir_, true); }, dir_ / "train-images-idx3-ubyte", "not found");

  // Image and label counts disagree: both files and both counts are named.
  write_raw(dir_ / "train-images-idx3-ubyte", idx_bytes({5, 2, 2}, counting(20)));
  write_raw(dir_ / "train-labels-idx1-ubyte", idx_bytes({4}, {1, 2, 3, 4}));
  try {
    load_fashion_mnist(dir_, true);
    ADD_FAILURE() << "expected DataError";
  } catch (const DataError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("train-images-idx3-ubyte"), std::string::npos) << what;
    EXPECT_NE(what.find("train-labels-idx1-ubyte"), std::string::npos) << what;
    EXPECT_NE(what.find("5 images"), std::string::npos) << what;
    EXPECT_NE(what.find("4 labels"), std::string::npos) << what;
  }

  // A label out of range: the first bad index is named.
  write_raw(dir_ / "train-labels-idx1-ubyte", idx_bytes({5}, {1, 2, 10, 4, 200}));
  expect_data_error([&] { load_fashion_mnist(dir_, true); }, dir_ / "train-labels-idx1-ubyte", "at index 2");

  // Images must be 3-d.
  write_raw(dir_ / "train-images-idx3-ubyte", idx_bytes({5, 4}, counting(20)));
  write_raw(dir_ / "train-labels-idx1-ubyte", idx_bytes({5}, {1, 2, 3, 4, 5}));
  expect_data_error([&] { load_fashion_mnist(dir_, true); }, dir_ / "train-images-idx3-ubyte", "expected 3");
}

// --- the inflated copies of gzipped files ---

// The first read writes the copy; the next one maps it and gives the same array.
TEST_F(IdxTest, AGzippedFileIsReadOnceAndItsInflatedCopyMappedAfter) {
  const Bytes payload = counting(5 * 6 * 7, 3);
  const fs::path p = dir_ / "b-idx3-ubyte.gz";
  write_gz(p, idx_bytes({5, 6, 7}, payload));
  const IdxArray first = read_idx(p);
  ASSERT_EQ(copies().size(), 1u);
  const fs::path copy = copies()[0];
  EXPECT_EQ(copy.filename().string().rfind("b-idx3-ubyte-", 0), 0u) << copy;
  EXPECT_EQ(read_all(copy), idx_bytes({5, 6, 7}, payload));  // a raw IDX file: the inflated bytes
  const auto written = fs::last_write_time(copy);
  const IdxArray again = read_idx(p);
  EXPECT_EQ(fs::last_write_time(copy), written);  // mapped, not written again
  EXPECT_EQ(again.dims, first.dims);
  EXPECT_TRUE(again.data.equal(first.data));
  EXPECT_TRUE(again.data.is_contiguous());
  // The mapping is private: writing to the array leaves the copy as it was.
  again.data.view(-1)[0].fill_(255);
  EXPECT_EQ(read_all(copy), idx_bytes({5, 6, 7}, payload));
}

// A damaged copy (cut short, as a crash of another writer could not leave it, but a disk might) is removed,
// and the gzip file read instead, which writes a good copy again.
TEST_F(IdxTest, ADamagedInflatedCopyIsReplacedFromTheGzipFile) {
  const Bytes payload = counting(4 * 4, 1);
  const fs::path p = dir_ / "c-idx2-ubyte.gz";
  write_gz(p, idx_bytes({4, 4}, payload));
  read_idx(p);
  ASSERT_EQ(copies().size(), 1u);
  const fs::path copy = copies()[0];
  fs::resize_file(copy, 10);
  const IdxArray a = read_idx(p);
  EXPECT_EQ(Bytes(a.data.data_ptr<uint8_t>(), a.data.data_ptr<uint8_t>() + a.data.numel()), payload);
  EXPECT_EQ(read_all(copy), idx_bytes({4, 4}, payload));
}

// A file rewritten in place with other data of the same size names another copy: the old one is not used.
TEST_F(IdxTest, AGzippedFileChangedInPlaceIsNotServedItsOldCopy) {
  const fs::path p = dir_ / "d-idx1-ubyte.gz";
  write_gz(p, idx_bytes({8}, counting(8, 0)));
  read_idx(p);
  write_gz(p, idx_bytes({8}, counting(8, 100)));
  const IdxArray a = read_idx(p);
  EXPECT_EQ(Bytes(a.data.data_ptr<uint8_t>(), a.data.data_ptr<uint8_t>() + 8), counting(8, 100));
  EXPECT_EQ(copies().size(), 2u);
}

// COHORT_IDX_CACHE=0 writes no copy; a raw file never has one; nor does a cache that cannot be written.
TEST_F(IdxTest, NoCopyWithoutAGzipFileOrAWritableCacheOrWhenTurnedOff) {
  const Bytes file = idx_bytes({3}, {7, 8, 9});
  write_raw(dir_ / "raw-idx1-ubyte", file);
  read_idx(dir_ / "raw-idx1-ubyte");
  EXPECT_TRUE(copies().empty());
  write_gz(dir_ / "e-idx1-ubyte.gz", file);
  ::setenv("COHORT_IDX_CACHE", "0", 1);
  read_idx(dir_ / "e-idx1-ubyte.gz");
  ::unsetenv("COHORT_IDX_CACHE");
  EXPECT_TRUE(copies().empty());
  write_raw(dir_ / "cache", {1});  // a file where the cache directory would be
  const IdxArray a = read_idx(dir_ / "e-idx1-ubyte.gz");
  EXPECT_EQ(Bytes(a.data.data_ptr<uint8_t>(), a.data.data_ptr<uint8_t>() + 3), (Bytes{7, 8, 9}));
}

// --- the real dataset ---

TEST(FashionMnistReal, LoadsBothSplits) {
  // COHORT_TEST_FASHION_MNIST_ROOT: the files elsewhere (scripts/gpu-check carries them to a machine
  // without Debian's package).
  const char* elsewhere = std::getenv("COHORT_TEST_FASHION_MNIST_ROOT");
  const fs::path root = elsewhere ? fs::path(elsewhere) : fs::path(cohort::data::kDefaultFashionMnistRoot);
  if (!fs::exists(root)) {
    // Not a skip: without the dataset the trainer cannot run either, and a silent pass would hide that.
    FAIL() << root << " is missing: install it with `apt-get install dataset-fashion-mnist`";
  }
  const ImageDataset train = load_fashion_mnist(root, true);
  EXPECT_EQ(train.images.sizes(), (at::IntArrayRef{60000, 1, 28, 28}));
  EXPECT_EQ(train.labels.size(0), 60000);
  const ImageDataset test = load_fashion_mnist(root, false);
  EXPECT_EQ(test.images.sizes(), (at::IntArrayRef{10000, 1, 28, 28}));
  EXPECT_EQ(test.labels.size(0), 10000);

  // Fashion-MNIST is balanced: 6000 training and 1000 test images per class.
  const at::Tensor train_counts = at::bincount(train.labels, {}, 10);
  const at::Tensor test_counts = at::bincount(test.labels, {}, 10);
  for (int k = 0; k < 10; ++k) {
    EXPECT_EQ(train_counts[k].item<int64_t>(), 6000) << "class " << k;
    EXPECT_EQ(test_counts[k].item<int64_t>(), 1000) << "class " << k;
  }
  // The stated normalization constants match the training images.
  const at::Tensor x = train.images.to(at::kFloat).div(255.0);
  EXPECT_NEAR(x.mean().item<double>(), train.mean, 5e-4);
  EXPECT_NEAR(x.std().item<double>(), train.std, 5e-4);
}

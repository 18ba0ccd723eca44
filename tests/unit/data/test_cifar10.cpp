// The CIFAR-10 binary reader on files written by the test: layout, labels, per-channel statistics, and
// the named errors for a truncated file, a bad label and a missing file. Also the Loader's order and
// its error forwarding.
#include <gtest/gtest.h>

#include <unistd.h>

#include <fstream>

#include <ATen/ATen.h>

#include "cohort/data/Cifar10.h"
#include "cohort/data/Source.h"
#include "cohort/util/Error.h"

namespace fs = std::filesystem;
using namespace cohort::data;

namespace {

// Record r of file f: label (f + r) % 10, pixel p of channel c = (r * 7 + c * 50 + p) % 256.
std::string records(int file, int count) {
  std::string out;
  for (int r = 0; r < count; ++r) {
    out += static_cast<char>((file + r) % 10);
    for (int c = 0; c < 3; ++c)
      for (int p = 0; p < 1024; ++p) out += static_cast<char>((r * 7 + c * 50 + p) % 256);
  }
  return out;
}

class Cifar10Files : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("cohort-cifar-" + std::to_string(::getpid())) / "cifar-10-batches-bin";
    fs::create_directories(root_);
    for (int i = 1; i <= 5; ++i) write("data_batch_" + std::to_string(i) + ".bin", records(i, 4));
    write("test_batch.bin", records(0, 3));
  }
  void TearDown() override { fs::remove_all(root_.parent_path()); }
  void write(const std::string& name, const std::string& bytes) {
    std::ofstream(root_ / name, std::ios::binary) << bytes;
  }
  std::string error_of(const fs::path& root, bool train) {
    try {
      load_cifar10(root, train);
    } catch (const cohort::DataError& e) {
      return e.describe();
    }
    return "no error";
  }
  fs::path root_;
};

}  // namespace

TEST_F(Cifar10Files, ReadsRecordsInFileOrderAsChw) {
  const auto train = load_cifar10(root_.parent_path(), /*train=*/true);  // the parent folder works too
  ASSERT_EQ(train.images.sizes(), (at::IntArrayRef{20, 3, 32, 32}));
  EXPECT_EQ(train.num_classes, 10);
  for (int64_t i = 0; i < 20; ++i) {
    const int file = 1 + i / 4, r = i % 4;
    EXPECT_EQ(train.labels[i].item<int64_t>(), (file + r) % 10);
    for (int c = 0; c < 3; ++c)
      EXPECT_EQ(train.images[i][c][1][2].item<uint8_t>(), (r * 7 + c * 50 + 34) % 256) << i << " " << c;
  }
  EXPECT_FLOAT_EQ(train.mean_of(2), 0.4465f);
  EXPECT_FLOAT_EQ(train.std_of(1), 0.2435f);
  const auto test = load_cifar10(root_, /*train=*/false, /*limit=*/2);
  EXPECT_EQ(test.size(), 2);
}

TEST_F(Cifar10Files, TruncatedBadLabelAndMissingFilesAreNamed) {
  write("test_batch.bin", records(0, 3).substr(0, 2 * 3073 + 100));
  std::string e = error_of(root_, false);
  EXPECT_NE(e.find("test_batch.bin"), std::string::npos) << e;
  EXPECT_NE(e.find("record 2 is cut off"), std::string::npos) << e;
  std::string bad = records(0, 3);
  bad[3073] = 42;  // record 1's label
  write("test_batch.bin", bad);
  e = error_of(root_, false);
  EXPECT_NE(e.find("record 1 has label 42"), std::string::npos) << e;
  fs::remove(root_ / "data_batch_3.bin");
  e = error_of(root_, true);
  EXPECT_NE(e.find("data_batch_3.bin does not exist"), std::string::npos) << e;
  EXPECT_NE(e.find("HINT"), std::string::npos) << e;
}

TEST_F(Cifar10Files, PerChannelNormalization) {
  auto src = in_memory(load_cifar10(root_, false));
  const auto b = src->batch({1}, AugmentOptions{});
  // Channel 1 of record 1 at pixel 0 is (7 + 50) = 57.
  EXPECT_NEAR(b.images[0][1][0][0].item<float>(), (57 / 255.0f - 0.4822f) / 0.2435f, 1e-6);
  EXPECT_NEAR(b.images[0][2][0][0].item<float>(), (107 / 255.0f - 0.4465f) / 0.2616f, 1e-6);
}

TEST_F(Cifar10Files, LoaderKeepsOrderAheadOrNot) {
  auto src = in_memory(load_cifar10(root_, true));
  for (int64_t prefetch : {0, 1, 3}) {
    Loader loader(*src, {{3, 1}, {0}, {19, 18, 2}}, AugmentOptions{}, prefetch);
    std::vector<int64_t> labels;
    while (auto b = loader.next())
      for (int64_t i = 0; i < b->size(); ++i) labels.push_back(b->labels[i].item<int64_t>());
    // labels of samples 3, 1, 0, 19, 18, 2 (file 1 + i/4, record i%4)
    EXPECT_EQ(labels, (std::vector<int64_t>{4, 2, 1, 8, 7, 3})) << prefetch;
  }
}

namespace {
class Failing : public Source {
 public:
  int64_t size() const override { return 10; }
  int64_t num_classes() const override { return 1; }
  int64_t channels() const override { return 1; }
  int64_t image_size() const override { return 1; }
  std::string name() const override { return "failing"; }
  Batch batch(const std::vector<int64_t>& indices, const AugmentOptions&) override {
    if (indices[0] == 2) throw cohort::DataError("sample 2 is broken");
    Batch b;
    b.labels = at::full({1}, indices[0], at::kLong);
    return b;
  }
};
}  // namespace

TEST(Loader, BackgroundErrorsReachTheCaller) {
  Failing src;
  Loader loader(src, {{0}, {1}, {2}, {3}}, AugmentOptions{}, 2);
  EXPECT_EQ(loader.next()->labels.item<int64_t>(), 0);
  EXPECT_EQ(loader.next()->labels.item<int64_t>(), 1);
  EXPECT_THROW(loader.next(), cohort::DataError);
}

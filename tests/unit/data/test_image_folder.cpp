// An image folder made by the test: classes sorted by name, counts, shapes, the bad-file policy (a
// corrupt JPEG and a non-image), deterministic crops for a fixed seed, and the val transform.
#include <gtest/gtest.h>

#include <unistd.h>

#include <ATen/ATen.h>

#include "cohort/data/ImageFolder.h"
#include "cohort/util/Error.h"
#include "support/JpegFiles.h"

namespace fs = std::filesystem;
using namespace cohort::data;
using cohort::testing::write_file;
using cohort::testing::write_jpeg;

namespace {

class ImageFolderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("cohort-imagefolder-" + std::to_string(::getpid()));
    fs::remove_all(root_);
    // Classes are created out of order; torchvision sorts them: ant=0, bee=1, cat=2.
    for (int i = 0; i < 3; ++i) write_jpeg(root_ / "cat" / ("c" + std::to_string(i) + ".jpg"), 120, 90, 10 + i);
    for (int i = 0; i < 2; ++i) write_jpeg(root_ / "ant" / ("a" + std::to_string(i) + ".JPEG"), 90, 120, 20 + i);
    for (int i = 0; i < 4; ++i) write_jpeg(root_ / "bee" / ("b" + std::to_string(i) + ".jpeg"), 64, 64, 30 + i);
    write_file(root_ / "bee" / "notes.txt", "not an image");             // left out by name
    write_file(root_ / "cat" / "c9.jpg", "\xff\xd8\xff\xe0 truncated");  // a .jpg that does not decode
  }
  void TearDown() override { fs::remove_all(root_); }
  ImageFolderOptions options(bool skip = true) {
    ImageFolderOptions o;
    o.image_size = 32;
    o.workers = 2;
    o.skip_bad_files = skip;
    return o;
  }
  fs::path root_;
};

}  // namespace

TEST_F(ImageFolderTest, ClassesSortedFilesCountedNonImagesLeftOut) {
  ImageFolder f(root_, options());
  EXPECT_EQ(f.classes(), (std::vector<std::string>{"ant", "bee", "cat"}));
  EXPECT_EQ(f.size(), 2 + 4 + 4);  // the corrupt c9.jpg is only found when decoded
  EXPECT_EQ(f.skipped_at_scan(), 1);
  EXPECT_EQ(f.label(0), 0);
  EXPECT_EQ(f.label(2), 1);
  EXPECT_EQ(f.label(9), 2);
  EXPECT_EQ(f.file(9).filename(), "c9.jpg");
  EXPECT_EQ(f.num_classes(), 3);
}

TEST_F(ImageFolderTest, BatchShapesAndDeterministicCropsForASeed) {
  ImageFolder f(root_, options());
  AugmentOptions aug;
  aug.enabled = true;
  aug.seed = 5;
  aug.epoch = 1;
  const auto a = f.batch({0, 3, 6}, aug);
  ASSERT_EQ(a.images.sizes(), (at::IntArrayRef{3, 3, 32, 32}));
  EXPECT_EQ(a.labels[1].item<int64_t>(), 1);
  const auto again = f.batch({6, 0}, aug);  // another batch, another order: the same sample, the same crop
  EXPECT_TRUE(again.images[1].equal(a.images[0]));
  EXPECT_TRUE(again.images[0].equal(a.images[2]));
  aug.epoch = 2;
  EXPECT_FALSE(f.batch({0}, aug).images[0].equal(a.images[0]));  // a new epoch draws new crops
  // Validation: resize + center crop, no randomness.
  const auto v1 = f.batch({4}, AugmentOptions{}), v2 = f.batch({4}, AugmentOptions{});
  EXPECT_TRUE(v1.images.equal(v2.images));
  EXPECT_LT(v1.images.abs().max().item<float>(), 3.0f);  // normalized with ImageNet statistics
}

TEST_F(ImageFolderTest, CorruptFileIsSkippedNamedAndReplaced) {
  ImageFolder f(root_, options(/*skip=*/true));
  testing::internal::CaptureStderr();
  const auto b = f.batch({9, 0}, AugmentOptions{});
  const std::string log = testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("c9.jpg"), std::string::npos) << log;
  EXPECT_EQ(f.bad_files(), 1);
  // Sample 9 is the last; its replacement is the next sample that decodes, sample 0 (ant).
  EXPECT_EQ(b.labels[0].item<int64_t>(), 0);
  EXPECT_TRUE(b.images[0].equal(b.images[1]));
  // Named once, counted once.
  testing::internal::CaptureStderr();
  f.batch({9}, AugmentOptions{});
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
  EXPECT_EQ(f.bad_files(), 1);
}

TEST_F(ImageFolderTest, FailPolicyNamesTheFile) {
  EXPECT_THROW(ImageFolder(root_, options(/*skip=*/false)), cohort::DataError);  // notes.txt
  fs::remove(root_ / "bee" / "notes.txt");
  ImageFolder f(root_, options(/*skip=*/false));
  try {
    f.batch({1, 9}, AugmentOptions{});
    FAIL() << "expected an error";
  } catch (const cohort::DataError& e) {
    EXPECT_NE(e.describe().find("c9.jpg"), std::string::npos) << e.describe();
    EXPECT_NE(e.describe().find("data.on_bad_file=skip"), std::string::npos) << e.describe();
  }
}

TEST_F(ImageFolderTest, MissingOrEmptyFoldersAreNamed) {
  EXPECT_THROW(ImageFolder(root_ / "nope", options()), cohort::DataError);
  fs::create_directories(root_ / "empty" / "x");
  try {
    ImageFolder(root_ / "empty", options());
    FAIL();
  } catch (const cohort::DataError& e) {
    EXPECT_NE(std::string(e.what()).find("no .jpg or .jpeg"), std::string::npos) << e.what();
  }
}

TEST_F(ImageFolderTest, LimitKeepsEveryClass) {
  ImageFolder f(root_, options(), /*limit=*/3);
  ASSERT_EQ(f.size(), 3);
  EXPECT_EQ(f.label(0), 0);
  EXPECT_EQ(f.label(1), 1);
  EXPECT_EQ(f.label(2), 2);
}

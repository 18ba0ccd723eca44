// AtomicFile: a committed file has its content; an uncommitted one leaves the previous file untouched and
// no temporary behind; I/O failures are CheckpointErrors that name the path.
#include "cohort/util/AtomicFile.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "cohort/util/Error.h"

namespace fs = std::filesystem;
using cohort::util::AtomicFile;
using cohort::util::write_file_atomic;

namespace {

class AtomicFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / ("cohort_atomic_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  static std::string read_all(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  // Every entry in the directory, so a leftover temporary shows up.
  std::vector<std::string> listing() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }

  fs::path dir_;
};

TEST_F(AtomicFileTest, CommittedFileHasContent) {
  const fs::path target = dir_ / "out.bin";
  {
    AtomicFile f(target);
    EXPECT_EQ(f.temp_path().string(), target.string() + ".tmp." + std::to_string(::getpid()));
    EXPECT_TRUE(fs::exists(f.temp_path()));
    EXPECT_FALSE(fs::exists(target));  // nothing visible before commit
    f.write("hello ", 6);
    f.write(std::string_view("world"));
    f.commit();
    EXPECT_TRUE(f.committed());
  }
  EXPECT_EQ(read_all(target), "hello world");
  EXPECT_EQ(listing(), std::vector<std::string>{"out.bin"});
}

TEST_F(AtomicFileTest, BinaryContentWithZeros) {
  const fs::path target = dir_ / "zeros.bin";
  std::string bytes(1 << 20, '\0');
  bytes[12345] = 'x';
  write_file_atomic(target, bytes);
  EXPECT_EQ(read_all(target), bytes);
}

TEST_F(AtomicFileTest, ReplacesExistingFile) {
  const fs::path target = dir_ / "state.json";
  write_file_atomic(target, "old content that is longer");
  write_file_atomic(target, "new");
  EXPECT_EQ(read_all(target), "new");
  EXPECT_EQ(listing(), std::vector<std::string>{"state.json"});
}

TEST_F(AtomicFileTest, ExceptionBeforeCommitKeepsPreviousFile) {
  const fs::path target = dir_ / "model.safetensors";
  write_file_atomic(target, "previous checkpoint");
  try {
    AtomicFile f(target);
    f.write("half of a new checkp", 20);
    throw std::runtime_error("simulated failure while saving");
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(read_all(target), "previous checkpoint");
  EXPECT_EQ(listing(), std::vector<std::string>{"model.safetensors"});
}

TEST_F(AtomicFileTest, DestroyedWithoutCommitWhenNoPreviousFile) {
  const fs::path target = dir_ / "never.bin";
  {
    AtomicFile f(target);
    f.write("abc", 3);
  }
  EXPECT_FALSE(fs::exists(target));
  EXPECT_TRUE(listing().empty());
}

TEST_F(AtomicFileTest, MissingDirectoryThrowsNamingPath) {
  const fs::path target = dir_ / "no_such_dir" / "out.bin";
  try {
    write_file_atomic(target, "x");
    FAIL() << "expected CheckpointError";
  } catch (const cohort::CheckpointError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(target.string()), std::string::npos) << msg;
    EXPECT_NE(msg.find("No such file or directory"), std::string::npos) << msg;
    EXPECT_FALSE(e.hint().empty());
  }
  EXPECT_THROW(AtomicFile f(target), cohort::CheckpointError);
}

TEST_F(AtomicFileTest, RenameFailureKeepsTargetAndCleansUp) {
  // A non-empty directory where the file should go makes rename() fail after the data was written.
  const fs::path target = dir_ / "blocked";
  fs::create_directories(target / "inside");
  {
    AtomicFile f(target);
    f.write("data", 4);
    EXPECT_THROW(f.commit(), cohort::CheckpointError);
  }
  EXPECT_TRUE(fs::is_directory(target / "inside"));
  EXPECT_EQ(listing(), std::vector<std::string>{"blocked"});
}

TEST_F(AtomicFileTest, RelativePathInWorkingDirectory) {
  const fs::path old_cwd = fs::current_path();
  fs::current_path(dir_);
  write_file_atomic("relative.txt", "rel");
  fs::current_path(old_cwd);
  EXPECT_EQ(read_all(dir_ / "relative.txt"), "rel");
}

}  // namespace

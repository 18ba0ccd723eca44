// launch::first_recorded_error: which worker error the launcher prints when a worker fails.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <fstream>

#include "cohort/launch/Launcher.h"

namespace fs = std::filesystem;

namespace {

fs::path error_file(const fs::path& dir, const std::string& name, const std::string& body, int seconds_ago) {
  const fs::path p = dir / name;
  std::ofstream(p) << body;
  fs::last_write_time(p, fs::file_time_type::clock::now() - std::chrono::seconds(seconds_ago));
  return p;
}

std::string torchelastic(const std::string& message) {
  return R"({"message": {"message": ")" + message + R"(", "extraInfo": {"rank": 0, "timestamp": "0"}}})";
}

}  // namespace

// The file written first wins, whatever its place in the list; a missing file, one without a message
// and one that is not JSON are passed over even when older.
TEST(FirstRecordedError, TheOldestFileWithAMessageIsTheRootCause) {
  const fs::path dir = fs::temp_directory_path() / ("cohort-first-error-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::vector<fs::path> files{
      error_file(dir, "rank0.json", torchelastic("rank 0: connection closed by peer"), 1),
      dir / "rank1.json",  // never written: the worker was killed
      error_file(dir, "rank2.json", torchelastic("rank 2: timed out after 10 s; rank(s) 4 stopped answering"), 3),
      error_file(dir, "rank3.json", "{not json", 9),
      error_file(dir, "rank4.json", R"({"message": {}})", 8),
  };
  const auto first = cohort::launch::first_recorded_error(files);
  EXPECT_EQ(first.index, 2);
  EXPECT_EQ(first.message, "rank 2: timed out after 10 s; rank(s) 4 stopped answering");

  const auto none = cohort::launch::first_recorded_error({files[1], files[3]});
  EXPECT_EQ(none.index, -1);
  EXPECT_TRUE(none.message.empty());
  fs::remove_all(dir);
}

// Which copy of std::filesystem our calls bind to: libstdc++'s (or one linked into the program), never
// the static copy that pip's libtorch_cpu.so exports (src/CMakeLists.txt says why libstdc++ is linked
// first).
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

namespace {

TEST(LinkOrder, FilesystemIsNotLibTorchsCopy) {
  // The address of an external function comes from the GOT, filled by the same lookup that binds our
  // calls: dladdr names the object that won.
  using TempDir = std::filesystem::path (*)();
  const TempDir f = &std::filesystem::temp_directory_path;
  Dl_info info{};
  ASSERT_NE(::dladdr(reinterpret_cast<void*>(f), &info), 0);
  ASSERT_NE(info.dli_fname, nullptr);
  const std::string where = info.dli_fname;
  EXPECT_EQ(where.find("libtorch"), std::string::npos) << "std::filesystem::temp_directory_path binds to " << where;
  // Where it is not in the program itself (dladdr names the program as it was started: maybe a relative
  // path), it is libstdc++'s.
  std::error_code ec;
  if (!std::filesystem::equivalent(where, "/proc/self/exe", ec)) {
    EXPECT_NE(where.find("libstdc++"), std::string::npos) << where;
  }
}

}  // namespace

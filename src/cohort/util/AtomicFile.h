// Writes a file so that readers only ever see the old content or the complete new content, never half.
//
// Bytes go to `<path>.tmp.<pid>` in the same directory; `commit()` fsyncs it, renames it over `<path>` and
// fsyncs the directory. Without a commit (an exception, a crash) the previous file stays as it was:
//
//   cohort::util::AtomicFile file(dir / "model.safetensors");
//   file.write(header.data(), header.size());
//   file.write(data.data(), data.size());
//   file.commit();  // before this line, "model.safetensors" still holds the last checkpoint
//
//   cohort::util::write_file_atomic(dir / "latest.json", R"({"step": 100})");
#pragma once

#include <cstddef>
#include <filesystem>
#include <string_view>

namespace cohort::util {

class AtomicFile {
 public:
  // Opens (creates or truncates) the temporary file. Throws cohort::CheckpointError when the directory
  // is missing or not writable.
  explicit AtomicFile(std::filesystem::path target);
  // Removes the temporary file unless commit() succeeded. Never throws.
  ~AtomicFile();

  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  AtomicFile(AtomicFile&&) = delete;
  AtomicFile& operator=(AtomicFile&&) = delete;

  // Appends bytes to the temporary file; throws cohort::CheckpointError on failure (e.g. disk full).
  void write(const void* data, std::size_t size);
  void write(std::string_view bytes) { write(bytes.data(), bytes.size()); }

  // Makes the new content durable and visible under the target name. Call once; throws
  // cohort::CheckpointError on failure. A failure before the rename leaves the previous content; one
  // after it (fsync of the directory) leaves the new content visible but perhaps not yet durable.
  void commit();

  const std::filesystem::path& target() const { return target_; }
  const std::filesystem::path& temp_path() const { return temp_; }
  bool committed() const { return committed_; }

 private:
  [[noreturn]] void fail(const char* step, int err) const;
  void close_fd() noexcept;

  std::filesystem::path target_;
  std::filesystem::path temp_;
  int fd_ = -1;
  bool committed_ = false;
};

// Replaces `path` with `bytes` atomically (see AtomicFile).
void write_file_atomic(const std::filesystem::path& path, std::string_view bytes);
// The same for a secret (a key, a token): the temporary is made readable by its owner alone before a byte
// is written to it, so the file the rename publishes was never readable by anyone else. Throws
// CheckpointError naming the file where the file system cannot make it so.
void write_private_file_atomic(const std::filesystem::path& path, std::string_view bytes);

}  // namespace cohort::util

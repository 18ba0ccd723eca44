#include "cohort/util/AtomicFile.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "cohort/util/Error.h"

namespace cohort::util {

namespace {

std::string hint_for(int err) {
  switch (err) {
    case ENOENT:
    case ENOTDIR: return "create the directory first (check ckpt.dir or the output path)";
    case EACCES:
    case EPERM:
    case EROFS: return "choose a directory this process may write to";
    case ENOSPC:
    case EDQUOT: return "free disk space or point the output at a larger volume";
    default: return {};
  }
}

// The directory whose entry rename() changes; "" (a bare file name) means the working directory.
std::filesystem::path parent_dir(const std::filesystem::path& p) {
  std::filesystem::path dir = p.parent_path();
  return dir.empty() ? std::filesystem::path(".") : dir;
}

}  // namespace

AtomicFile::AtomicFile(std::filesystem::path target) : target_(std::move(target)) {
  // The temporary lives in the target's directory so that rename() stays within one filesystem and is
  // therefore atomic. The pid keeps two processes saving the same path from writing into one file.
  temp_ = target_;
  temp_ += ".tmp." + std::to_string(::getpid());
  do {
    fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  } while (fd_ < 0 && errno == EINTR);
  if (fd_ < 0) fail("open", errno);
}

AtomicFile::~AtomicFile() {
  close_fd();
  // Nothing was renamed, so the temporary is ours to remove; the target was never touched.
  if (!committed_) ::unlink(temp_.c_str());
}

void AtomicFile::close_fd() noexcept {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

void AtomicFile::fail(const char* step, int err) const {
  throw CheckpointError(
      "cannot write '" + target_.string() + "': " + step + " of '" + temp_.string() + "' failed: " + std::strerror(err),
      hint_for(err));
}

void AtomicFile::write(const void* data, std::size_t size) {
  COHORT_ASSERT(!committed_ && fd_ >= 0, "AtomicFile::write after commit or after a failed commit");
  const char* p = static_cast<const char*>(data);
  // write() may take fewer bytes than asked (signals, Linux's 2 GiB per-call cap), so loop.
  while (size > 0) {
    ssize_t n = ::write(fd_, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("write", errno);
    }
    if (n == 0) fail("write", EIO);
    p += n;
    size -= static_cast<std::size_t>(n);
  }
}

void AtomicFile::commit() {
  COHORT_ASSERT(!committed_ && fd_ >= 0, "AtomicFile::commit called twice or after a failed commit");
  // We write with raw write(), so there is no user-space buffer to flush; fsync puts the data on disk
  // before the rename can make it visible. Without it a crash could leave the new name pointing at a
  // file whose blocks were never written.
  if (::fsync(fd_) != 0) {
    int err = errno;
    close_fd();
    fail("fsync", err);
  }
  // close() can report a deferred write error (NFS), so it is checked, not left to the destructor.
  int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) fail("close", errno);
  if (::rename(temp_.c_str(), target_.c_str()) != 0) fail("rename", errno);
  committed_ = true;

  // The rename lives in the directory's entries; fsync the directory so that it survives a power loss.
  // Some filesystems cannot fsync a directory (EINVAL); the rename is still atomic there.
  std::filesystem::path dir = parent_dir(target_);
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) fail("open directory", errno);
  int drc = ::fsync(dfd);
  int derr = errno;
  ::close(dfd);
  if (drc != 0 && derr != EINVAL) fail("fsync directory", derr);
}

void write_file_atomic(const std::filesystem::path& path, std::string_view bytes) {
  AtomicFile file(path);
  file.write(bytes);
  file.commit();
}

void write_private_file_atomic(const std::filesystem::path& path, std::string_view bytes) {
  AtomicFile file(path);
  std::error_code ec;
  std::filesystem::permissions(file.temp_path(),
                               std::filesystem::perms::owner_read | std::filesystem::perms::owner_write,
                               std::filesystem::perm_options::replace, ec);
  if (ec)
    throw CheckpointError("cannot make '" + file.temp_path().string() + "' private: " + ec.message(),
                          "write it to a filesystem that supports Unix permissions");
  file.write(bytes);
  file.commit();
}

}  // namespace cohort::util

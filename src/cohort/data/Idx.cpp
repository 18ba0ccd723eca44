#include "cohort/data/Idx.h"

#include <ATen/ATen.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <system_error>
#include <type_traits>

#include "cohort/util/Error.h"

namespace cohort::data {
namespace {

namespace fs = std::filesystem;

constexpr const char* kHint =
    "the file is damaged or not an IDX file: reinstall it (apt-get install --reinstall "
    "dataset-fashion-mnist) or re-download it, or point data.root=DIR at a good copy";

// gzread takes an unsigned length, so large arrays are read in pieces well below UINT_MAX.
constexpr int64_t kReadChunk = int64_t{1} << 24;

[[noreturn]] void fail(const fs::path& path, const std::string& what) {
  throw DataError("IDX file " + path.string() + ": " + what, kHint);
}

const char* type_name(uint8_t type) {
  switch (type) {
    case 0x08: return "unsigned byte";
    case 0x09: return "signed byte";
    case 0x0B: return "int16";
    case 0x0C: return "int32";
    case 0x0D: return "float32";
    case 0x0E: return "float64";
    default: return "not a valid IDX type";
  }
}

std::string hex_byte(uint8_t b) {
  char buf[8];
  std::snprintf(buf, sizeof(buf), "0x%02X", static_cast<unsigned>(b));
  return buf;
}

struct GzClose {
  void operator()(gzFile f) const { gzclose(f); }
};
using GzHandle = std::unique_ptr<std::remove_pointer_t<gzFile>, GzClose>;

// Owns the zlib handle and turns zlib's error codes into messages about this file.
class IdxStream {
 public:
  explicit IdxStream(const fs::path& path) : path_(path) {
    // zlib reads raw files transparently, so detection only decides how errors are worded.
    {
      std::ifstream probe(path, std::ios::binary);
      if (!probe) fail(path, std::string("cannot be opened for reading (") + std::strerror(errno) + ")");
      unsigned char magic[2] = {0, 0};
      probe.read(reinterpret_cast<char*>(magic), 2);
      gzipped_ = probe.gcount() == 2 && magic[0] == 0x1f && magic[1] == 0x8b;
    }
    file_.reset(gzopen(path.c_str(), "rb"));
    if (!file_) fail(path, std::string("cannot be opened for reading (") + std::strerror(errno) + ")");
    // A bigger buffer than zlib's 8 KiB default: the image file is 26 MiB compressed.
    gzbuffer(file_.get(), 1 << 17);
  }

  bool gzipped() const { return gzipped_; }

  // Reads up to n bytes and returns how many arrived; fewer than n means the data ended. Corrupt deflate
  // data and a bad CRC make zlib return -1, which throws here.
  int64_t read(uint8_t* dst, int64_t n) {
    int64_t done = 0;
    while (done < n) {
      const auto want = static_cast<unsigned>(std::min(n - done, kReadChunk));
      const int got = gzread(file_.get(), dst + done, want);
      if (got < 0) {
        int errnum = 0;
        const char* msg = gzerror(file_.get(), &errnum);
        fail(path_, std::string(gzipped_ ? "the gzip stream is corrupt (" : "read error (") + msg + ")");
      }
      if (got == 0) break;
      done += got;
    }
    return done;
  }

  // zlib reports a gzip stream that stops mid-way (no end-of-stream marker or CRC trailer) as
  // Z_BUF_ERROR without failing the read, so callers ask after a short read or at the end.
  bool cut_short() {
    int errnum = 0;
    gzerror(file_.get(), &errnum);
    return gzipped_ && errnum == Z_BUF_ERROR;
  }

 private:
  fs::path path_;
  GzHandle file_;
  bool gzipped_ = false;
};

}  // namespace

IdxArray read_idx(const fs::path& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) fail(path, "does not exist");
  if (fs::is_directory(path, ec)) fail(path, "is a directory, not a file");

  IdxStream in(path);
  const std::string compressed = in.gzipped() ? " (after gunzip)" : "";

  std::array<uint8_t, 4> magic{};
  const int64_t got_magic = in.read(magic.data(), 4);
  if (got_magic < 4) {
    fail(path, "is too short for an IDX header: " + std::to_string(got_magic) + " bytes" + compressed);
  }
  if (magic[0] != 0 || magic[1] != 0) {
    fail(path, "bad magic: the first two bytes are " + hex_byte(magic[0]) + " " + hex_byte(magic[1]) +
                   ", an IDX file starts with 0x00 0x00");
  }
  if (magic[2] != kIdxTypeUint8) {
    fail(path, "element type " + hex_byte(magic[2]) + " (" + type_name(magic[2]) +
                   ") is not supported; only " + hex_byte(kIdxTypeUint8) + " (unsigned byte) is");
  }
  const int ndim = magic[3];
  if (ndim < 1 || ndim > kIdxMaxDims) {
    fail(path, "has " + std::to_string(ndim) + " dimensions; expected 1 to " + std::to_string(kIdxMaxDims));
  }

  std::array<uint8_t, 4 * kIdxMaxDims> raw_dims{};
  const int64_t dim_bytes = 4 * ndim;
  if (in.read(raw_dims.data(), dim_bytes) < dim_bytes) {
    fail(path, "header ends before its " + std::to_string(ndim) + " dimension sizes" + compressed);
  }
  IdxArray out;
  int64_t total = 1;
  for (int i = 0; i < ndim; ++i) {
    const uint8_t* b = raw_dims.data() + 4 * i;
    // Sizes are big-endian; assemble them byte by byte so the host's endianness never matters.
    const int64_t d = (int64_t{b[0]} << 24) | (int64_t{b[1]} << 16) | (int64_t{b[2]} << 8) | int64_t{b[3]};
    if (d == 0) fail(path, "dimension " + std::to_string(i) + " of " + std::to_string(ndim) + " is 0");
    // Compared before multiplying, so the product never overflows: total stays below 2^34 throughout.
    if (d > (kIdxMaxElements - 1) / total) {
      fail(path, "header claims more than 2^34 elements (dimension " + std::to_string(i) + " is " +
                     std::to_string(d) + "), which no sane dataset has");
    }
    total *= d;
    out.dims.push_back(d);
  }

  // For a raw file the size on disk tells us up front whether the data is complete, so a corrupt header
  // cannot make us allocate gigabytes first. A gzip file only learns that by reading.
  const int64_t header_bytes = 4 + dim_bytes;
  if (!in.gzipped()) {
    const auto on_disk = static_cast<int64_t>(fs::file_size(path, ec));
    if (!ec && on_disk < header_bytes + total) {
      fail(path, "file ends after " + std::to_string(on_disk - header_bytes) + " of " + std::to_string(total) +
                     " data bytes (truncated)");
    }
  }

  try {
    out.data = at::empty({total}, at::TensorOptions().dtype(at::kByte));
  } catch (const c10::Error& e) {
    fail(path, "cannot allocate " + std::to_string(total) + " bytes for its data: " + e.what_without_backtrace());
  }
  const int64_t got = in.read(out.data.data_ptr<uint8_t>(), total);
  if (got < total) {
    fail(path, "file ends after " + std::to_string(got) + " of " + std::to_string(total) + " data bytes" +
                   (in.cut_short() ? " (the gzip stream is cut short)" : " (truncated)"));
  }

  // Reading on to the end both counts trailing bytes and makes zlib check the gzip CRC. (Bytes after the
  // end of a gzip member are not data: zlib ignores them, as gunzip does.)
  int64_t extra = 0;
  std::array<uint8_t, 1 << 16> scratch{};
  for (int64_t n; (n = in.read(scratch.data(), static_cast<int64_t>(scratch.size()))) > 0;) extra += n;
  if (extra > 0) {
    fail(path, "has " + std::to_string(extra) + " extra bytes after the " + std::to_string(total) +
                   " data bytes its header declares" + compressed);
  }
  if (in.cut_short()) fail(path, "the gzip stream is cut short after all data bytes (missing trailer)");

  out.data = out.data.view(out.dims);
  return out;
}

}  // namespace cohort::data

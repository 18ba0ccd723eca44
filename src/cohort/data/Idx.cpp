#include "cohort/data/Idx.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <system_error>

#include "cohort/util/AtomicFile.h"
#include "cohort/util/CacheDir.h"
#include "cohort/util/Error.h"

namespace cohort::data {
namespace {

namespace fs = std::filesystem;

constexpr const char* kHint =
    "the file is damaged or not an IDX file: reinstall it (apt-get install --reinstall "
    "dataset-fashion-mnist) or re-download it, or point data.root=DIR at a good copy";

// zlib counts bytes in unsigned ints, so large arrays and inputs are handed over in pieces well below
// UINT_MAX.
constexpr int64_t kReadChunk = int64_t{1} << 24;
constexpr size_t kInputChunk = size_t{1} << 30;

[[noreturn]] void fail(const std::string& source, const std::string& what) {
  throw DataError("IDX file " + source + ": " + what, kHint);
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

// Whether `bytes` start a gzip member (its magic, 0x1f 0x8b).
bool starts_gzip(std::string_view bytes) {
  return bytes.size() >= 2 && static_cast<uint8_t>(bytes[0]) == 0x1f && static_cast<uint8_t>(bytes[1]) == 0x8b;
}

// Hands out a file's IDX bytes from memory, inflating them first when the file is gzip. It reads as
// zlib's gzread reads a file, which is what this reader used before it took bytes: raw bytes pass
// through unchanged; gzip members follow one another; bytes after a member that do not start another one
// are ignored, as gunzip does. zlib's messages keep gzread's "<file>: <what>" form.
class IdxStream {
 public:
  IdxStream(std::string_view bytes, const std::string& source) : in_(bytes), source_(source) {
    gzipped_ = starts_gzip(bytes);
    if (!gzipped_) return;
    // 15 + 16: a 32 KiB window and a gzip wrapper (header and CRC-32 trailer checked), as gzread uses.
    if (inflateInit2(&z_, 15 + 16) != Z_OK)
      fail(source_, "the gzip stream is corrupt (" + source_ + ": out of memory)");
    feed(0);
  }
  ~IdxStream() {
    if (gzipped_) inflateEnd(&z_);
  }
  IdxStream(const IdxStream&) = delete;
  IdxStream& operator=(const IdxStream&) = delete;

  bool gzipped() const { return gzipped_; }

  // Reads up to n bytes and returns how many arrived; fewer than n means the data ended. Corrupt deflate
  // data and a bad CRC throw here.
  int64_t read(uint8_t* dst, int64_t n) {
    if (!gzipped_) {
      const int64_t got = std::min<int64_t>(n, static_cast<int64_t>(in_.size() - pos_));
      if (got > 0) std::memcpy(dst, in_.data() + pos_, static_cast<size_t>(got));
      pos_ += static_cast<size_t>(got);
      return got;
    }
    int64_t done = 0;
    while (done < n && !ended_ && !cut_short_) {
      if (z_.avail_in == 0) {
        if (consumed() == in_.size()) {
          // The input ran out inside a member: gzread calls this "unexpected end of file".
          cut_short_ = true;
          break;
        }
        feed(consumed());
      }
      z_.next_out = dst + done;
      z_.avail_out = static_cast<unsigned>(std::min(n - done, kReadChunk));
      const unsigned asked = z_.avail_out;
      const int rc = inflate(&z_, Z_NO_FLUSH);
      done += asked - z_.avail_out;
      if (rc == Z_STREAM_END) {
        // Another member may follow; anything else after a member is not data.
        const size_t at = consumed();
        if (starts_gzip(in_.substr(at))) {
          inflateReset(&z_);
          feed(at);
        } else {
          ended_ = true;
        }
      } else if (rc != Z_OK && rc != Z_BUF_ERROR) {  // Z_BUF_ERROR: more input needed, handled above
        const char* msg = rc == Z_MEM_ERROR ? "out of memory" : z_.msg != nullptr ? z_.msg : "compressed data error";
        fail(source_, "the gzip stream is corrupt (" + source_ + ": " + msg + ")");
      }
    }
    return done;
  }

  // Whether a gzip stream stopped mid-way (no end-of-stream marker or CRC trailer). Reading stops
  // without an error then, so callers ask after a short read or at the end.
  bool cut_short() const { return gzipped_ && cut_short_; }

 private:
  // The offset in `in_` of the next byte zlib has not consumed.
  size_t consumed() const { return fed_ - z_.avail_in; }
  void feed(size_t from) {
    const size_t n = std::min(in_.size() - from, kInputChunk);
    z_.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in_.data() + from));
    z_.avail_in = static_cast<unsigned>(n);
    fed_ = from + n;
  }

  std::string_view in_;
  std::string source_;
  bool gzipped_ = false;
  size_t pos_ = 0;  // raw files: the next byte to hand out
  z_stream z_{};
  size_t fed_ = 0;  // gzip: the end of the input handed to zlib so far
  bool ended_ = false;
  bool cut_short_ = false;
};

// An IDX file's header: its dimensions, their product and the header's length in bytes.
struct IdxHeader {
  std::vector<int64_t> dims;
  int64_t total = 1;
  int64_t bytes = 0;
};

// Reads and checks the header at the start of `in` (`compressed` ends the messages of a gzip file).
IdxHeader read_header(IdxStream& in, const std::string& source, const std::string& compressed) {
  std::array<uint8_t, 4> magic{};
  const int64_t got_magic = in.read(magic.data(), 4);
  if (got_magic < 4) {
    fail(source, "is too short for an IDX header: " + std::to_string(got_magic) + " bytes" + compressed);
  }
  if (magic[0] != 0 || magic[1] != 0) {
    fail(source, "bad magic: the first two bytes are " + hex_byte(magic[0]) + " " + hex_byte(magic[1]) +
                     ", an IDX file starts with 0x00 0x00");
  }
  if (magic[2] != kIdxTypeUint8) {
    fail(source, "element type " + hex_byte(magic[2]) + " (" + type_name(magic[2]) + ") is not supported; only " +
                     hex_byte(kIdxTypeUint8) + " (unsigned byte) is");
  }
  const int ndim = magic[3];
  if (ndim < 1 || ndim > kIdxMaxDims) {
    fail(source, "has " + std::to_string(ndim) + " dimensions; expected 1 to " + std::to_string(kIdxMaxDims));
  }

  std::array<uint8_t, 4 * kIdxMaxDims> raw_dims{};
  const int64_t dim_bytes = 4 * ndim;
  if (in.read(raw_dims.data(), dim_bytes) < dim_bytes) {
    fail(source, "header ends before its " + std::to_string(ndim) + " dimension sizes" + compressed);
  }
  IdxHeader h;
  for (int i = 0; i < ndim; ++i) {
    const uint8_t* b = raw_dims.data() + 4 * i;
    // Sizes are big-endian; assemble them byte by byte so the host's endianness never matters.
    const int64_t d = (int64_t{b[0]} << 24) | (int64_t{b[1]} << 16) | (int64_t{b[2]} << 8) | int64_t{b[3]};
    if (d == 0) fail(source, "dimension " + std::to_string(i) + " of " + std::to_string(ndim) + " is 0");
    // Compared before multiplying, so the product never overflows: total stays below 2^34 throughout.
    if (d > (kIdxMaxElements - 1) / h.total) {
      fail(source, "header claims more than 2^34 elements (dimension " + std::to_string(i) + " is " +
                       std::to_string(d) + "), which no sane dataset has");
    }
    h.total *= d;
    h.dims.push_back(d);
  }
  h.bytes = 4 + dim_bytes;
  return h;
}

}  // namespace

IdxArray read_idx_bytes(std::string_view bytes, const std::string& source) {
  IdxStream in(bytes, source);
  const std::string compressed = in.gzipped() ? " (after gunzip)" : "";
  const IdxHeader h = read_header(in, source, compressed);
  IdxArray out;
  out.dims = h.dims;
  const int64_t total = h.total, header_bytes = h.bytes;

  // A corrupt header must not make us allocate gigabytes first. For a raw file the size tells up front
  // whether the data is complete; a gzip file can at least not hold more than deflate can expand to.
  const auto on_disk = static_cast<int64_t>(bytes.size());
  if (!in.gzipped() && on_disk < header_bytes + total) {
    fail(source, "file ends after " + std::to_string(on_disk - header_bytes) + " of " + std::to_string(total) +
                     " data bytes (truncated)");
  }
  if (in.gzipped() && total / kDeflateMaxRatio > on_disk) {
    fail(source, "header declares " + std::to_string(total) + " data bytes, more than a " + std::to_string(on_disk) +
                     "-byte gzip file can hold (deflate expands at most " + std::to_string(kDeflateMaxRatio) +
                     ":1); the header is corrupt");
  }

  try {
    out.data = at::empty({total}, at::TensorOptions().dtype(at::kByte));
  } catch (const c10::Error& e) {
    fail(source, "cannot allocate " + std::to_string(total) + " bytes for its data: " + e.what_without_backtrace());
  }
  const int64_t got = in.read(out.data.data_ptr<uint8_t>(), total);
  if (got < total) {
    fail(source, "file ends after " + std::to_string(got) + " of " + std::to_string(total) + " data bytes" +
                     (in.cut_short() ? " (the gzip stream is cut short)" : " (truncated)"));
  }

  // Reading on to the end both counts trailing bytes and makes zlib check the gzip CRC. (Bytes after the
  // end of a gzip member are not data: zlib ignores them, as gunzip does.)
  int64_t extra = 0;
  std::array<uint8_t, 1 << 16> scratch{};
  for (int64_t n; (n = in.read(scratch.data(), static_cast<int64_t>(scratch.size()))) > 0;) extra += n;
  if (extra > 0) {
    fail(source, "has " + std::to_string(extra) + " extra bytes after the " + std::to_string(total) +
                     " data bytes its header declares" + compressed);
  }
  if (in.cut_short()) fail(source, "the gzip stream is cut short after all data bytes (missing trailer)");

  out.data = out.data.view(out.dims);
  return out;
}

namespace {

// Note [An inflated copy of a gzipped IDX file]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Every worker, and every swarm peer, inflated the same 26 MiB of gzip into 45 MiB of its own: 0.2 s of a
// core at each start, and 64 copies of the dataset on a machine with 64 peers. So the first reader of a
// gzipped file also writes the inflated IDX file, after the checks every read makes (the gzip CRC among
// them), to util::cache_dir()/idx/, atomically, under a name made of the source's name and the hash and
// size of its bytes: a file changed in place names another copy. Later readers (which still read the
// gzip file, 20 ms, to hash it) map that
// copy privately, which shares its pages with every other process that maps it until one writes to them
// (none does: the data sets only read their images). Each map checks the copy again (its header, and a
// size exactly the header's); one that fails is removed and the gzip file read instead. A copy that
// cannot be written (a full disk, a read-only home) costs only the time: the data came from the gzip
// file. COHORT_IDX_CACHE=0 turns the copies off; a raw (not gzipped) file is read as it is.

// The copy's name: the source's name, and the hash and size of its gzip bytes, so that a file changed in
// place, even within its file system's timestamp tick, names another copy.
std::optional<fs::path> inflated_copy_of(const fs::path& source, std::string_view gzip_bytes) {
  if (const char* on = std::getenv("COHORT_IDX_CACHE"); on && std::string(on) == "0") return std::nullopt;
  char name[48];
  std::snprintf(name, sizeof name, "-%016zx-%zu.idx", std::hash<std::string_view>{}(gzip_bytes), gzip_bytes.size());
  return util::cache_dir() / "idx" / (source.stem().string() + name);
}

// The copy mapped as an IdxArray whose data lives in the mapping, or nothing when it is missing or fails
// its checks (then it is removed).
std::optional<IdxArray> map_inflated_copy(const fs::path& copy) {
  const int fd = ::open(copy.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  struct stat st {};
  void* base = MAP_FAILED;
  if (::fstat(fd, &st) == 0 && st.st_size > 0)
    base = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (base == MAP_FAILED) return std::nullopt;
  const auto length = static_cast<size_t>(st.st_size);
  try {
    const std::string_view bytes(static_cast<const char*>(base), length);
    IdxStream in(bytes, copy.string());
    const IdxHeader h = read_header(in, copy.string(), "");
    if (in.gzipped() || h.bytes + h.total != static_cast<int64_t>(length))
      fail(copy.string(), "is not the inflated copy it names");
    IdxArray out;
    out.dims = h.dims;
    out.data = at::from_blob(
        static_cast<uint8_t*>(base) + h.bytes, h.dims, [base, length](void*) { ::munmap(base, length); },
        at::TensorOptions().dtype(at::kByte));
    return out;
  } catch (const std::exception&) {
    ::munmap(base, length);
    std::error_code ec;
    fs::remove(copy, ec);
    return std::nullopt;
  }
}

// Writes `a` as a raw IDX file at `copy`, or nothing when it cannot.
void write_inflated_copy(const fs::path& copy, const IdxArray& a) noexcept {
  try {
    std::error_code ec;
    fs::create_directories(copy.parent_path(), ec);
    std::string header = {0, 0, static_cast<char>(kIdxTypeUint8), static_cast<char>(a.dims.size())};
    for (const int64_t d : a.dims)
      for (const int shift : {24, 16, 8, 0}) header.push_back(static_cast<char>((d >> shift) & 0xFF));
    util::AtomicFile file(copy);
    file.write(header);
    file.write(a.data.data_ptr<uint8_t>(), static_cast<size_t>(a.data.numel()));
    file.commit();
  } catch (const std::exception&) {
  }
}

}  // namespace

IdxArray read_idx(const fs::path& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) fail(path.string(), "does not exist");
  if (fs::is_directory(path, ec)) fail(path.string(), "is a directory, not a file");
  // The whole file in memory: at most the 26 MiB of the gzipped training images, for a moment.
  std::ifstream file(path, std::ios::binary);
  if (!file) fail(path.string(), std::string("cannot be opened for reading (") + std::strerror(errno) + ")");
  std::string bytes;
  if (const auto size = fs::file_size(path, ec); !ec) bytes.reserve(static_cast<size_t>(size));
  char chunk[1 << 16];
  while (file.read(chunk, sizeof chunk) || file.gcount() > 0) bytes.append(chunk, static_cast<size_t>(file.gcount()));
  if (file.bad()) fail(path.string(), std::string("read error (") + std::strerror(errno) + ")");
  // The inflated copy: see Note [An inflated copy of a gzipped IDX file] above.
  const bool gzipped = starts_gzip(bytes);
  const auto copy = gzipped ? inflated_copy_of(path, bytes) : std::nullopt;
  if (copy)
    if (auto mapped = map_inflated_copy(*copy)) return std::move(*mapped);
  auto out = read_idx_bytes(bytes, path.string());
  if (copy) write_inflated_copy(*copy, out);
  return out;
}

}  // namespace cohort::data

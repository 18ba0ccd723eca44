#include "cohort/checkpoint/Safetensors.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "cohort/util/AtomicFile.h"
#include "cohort/util/Crc32c.h"
#include "cohort/util/Error.h"

// The format stores little-endian bytes and we copy tensor memory as is, which is only right on a
// little-endian host (x86-64 and aarch64, everything cohort runs on).
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "cohort's safetensors code assumes a little-endian host"
#endif

namespace cohort::checkpoint {

namespace {

using OrderedJson = nlohmann::ordered_json;

struct DtypeInfo {
  const char* name;
  at::ScalarType type;
};

constexpr DtypeInfo kDtypes[] = {
    {"F64", at::kDouble}, {"F32", at::kFloat}, {"F16", at::kHalf}, {"BF16", at::kBFloat16}, {"I64", at::kLong},
    {"I32", at::kInt},    {"I16", at::kShort}, {"I8", at::kChar},  {"U8", at::kByte},       {"BOOL", at::kBool},
};

const DtypeInfo* find_dtype(at::ScalarType t) {
  for (const auto& d : kDtypes)
    if (d.type == t) return &d;
  return nullptr;
}

const DtypeInfo* find_dtype(const std::string& name) {
  for (const auto& d : kDtypes)
    if (name == d.name) return &d;
  return nullptr;
}

const char* kMetadataKey = "__metadata__";

// ---------------------------------------------------------------------------------------------- writing

// Builds the padded header. Only shapes and dtypes are needed, so no tensor is copied yet.
std::string build_header(const NamedTensors& tensors, const std::map<std::string, std::string>& metadata,
                         std::vector<std::uint64_t>& nbytes) {
  OrderedJson header = OrderedJson::object();
  // Like the reference writer, metadata goes first; readers do not care where it is.
  if (!metadata.empty()) {
    OrderedJson meta = OrderedJson::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header[kMetadataKey] = std::move(meta);
  }
  std::set<std::string> seen;
  std::uint64_t offset = 0;
  nbytes.clear();
  for (const auto& [name, t] : tensors) {
    if (name == kMetadataKey)
      throw CheckpointError("cannot save a tensor named '__metadata__': the name is reserved by safetensors",
                            "rename the tensor");
    if (!seen.insert(name).second)
      throw CheckpointError("cannot save two tensors named '" + name + "' in one safetensors file",
                            "give every tensor a unique name");
    if (!t.defined()) throw CheckpointError("cannot save tensor '" + name + "': it is undefined");
    if (t.layout() != at::kStrided || t.is_quantized())
      throw CheckpointError("cannot save tensor '" + name + "': only dense tensors can be saved",
                            "convert it with .to_dense() (or dequantize) first");
    const DtypeInfo* d = find_dtype(t.scalar_type());
    if (d == nullptr)
      throw CheckpointError("cannot save tensor '" + name + "': dtype " + std::string(c10::toString(t.scalar_type())) +
                                " is not supported",
                            "supported: F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL; convert it with .to(...)");
    const std::uint64_t n = static_cast<std::uint64_t>(t.numel()) * t.element_size();
    nbytes.push_back(n);
    header[name] = {{"dtype", d->name}, {"shape", t.sizes().vec()}, {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    // dump() rejects names or metadata that are not valid UTF-8, which no reader could decode.
    throw CheckpointError(std::string("cannot save safetensors header: ") + e.what(),
                          "tensor names and metadata must be valid UTF-8");
  }
  // Padding to 8 keeps the data start 8-byte aligned, so readers that map the file can use it in place.
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

constexpr std::string_view kChecksumKey = "cohort.crc32c";

std::string checksum_text(uint32_t c) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", c);
  return buf;
}

// Streams a whole file to `sink(const void*, size_t)`. Each tensor is made CPU-contiguous only while it is
// written, so saving a GPU model never holds a second full copy of it in host memory.
//
// Note [Checkpoint checksums]
// The header's metadata carries "cohort.crc32c", the CRC-32C of the whole data section, and the reader
// checks it: a flipped bit on disk or in a copy is an error naming the file, not weights that load and
// train on silently wrong numbers. It costs a first pass over the tensors before the header is written.
// Files from elsewhere (no such entry) load unchecked; Python's safetensors ignores the entry.
template <class Sink>
void serialize(const NamedTensors& tensors, const std::map<std::string, std::string>& metadata_in, Sink&& sink) {
  auto metadata = metadata_in;
  util::Crc32c crc;
  for (const auto& [name, t] : tensors) {
    if (t.numel() == 0) continue;
    at::Tensor cpu = t.detach().to(at::kCPU).contiguous();
    crc.update(cpu.data_ptr(), cpu.numel() * cpu.element_size());
  }
  metadata[std::string(kChecksumKey)] = checksum_text(crc.value());
  std::vector<std::uint64_t> nbytes;
  const std::string header = build_header(tensors, metadata, nbytes);
  const std::uint64_t n = header.size();  // stored little-endian; the host is little-endian (see top)
  sink(&n, sizeof(n));
  sink(header.data(), header.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    if (nbytes[i] == 0) continue;
    at::Tensor cpu = tensors[i].second.detach().to(at::kCPU).contiguous();
    sink(cpu.data_ptr(), nbytes[i]);
  }
}

// ---------------------------------------------------------------------------------------------- reading

[[noreturn]] void corrupt(const std::string& source, const std::string& what) {
  throw CheckpointError("safetensors file '" + source + "': " + what,
                        "the file is truncated or corrupt, or was not written as safetensors; re-save it");
}

struct Entry {
  std::string name;
  at::ScalarType type;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
};

std::uint64_t read_u64(const OrderedJson& v, bool& ok) {
  if (v.is_number_unsigned()) return v.get<std::uint64_t>();
  if (v.is_number_integer() && v.get<std::int64_t>() >= 0) return static_cast<std::uint64_t>(v.get<std::int64_t>());
  ok = false;
  return 0;
}

Entry parse_entry(const std::string& source, const std::string& name, const OrderedJson& v) {
  const std::string where = "tensor '" + name + "'";
  if (!v.is_object()) corrupt(source, where + ": header entry is not a JSON object");
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!v.contains(key)) corrupt(source, where + ": header entry has no \"" + key + "\"");

  Entry e;
  e.name = name;
  const OrderedJson& dtype = v["dtype"];
  if (!dtype.is_string()) corrupt(source, where + ": \"dtype\" is not a string");
  const DtypeInfo* d = find_dtype(dtype.get<std::string>());
  if (d == nullptr) corrupt(source, where + ": unknown or unsupported dtype '" + dtype.get<std::string>() + "'");
  e.type = d->type;

  const OrderedJson& shape = v["shape"];
  if (!shape.is_array()) corrupt(source, where + ": \"shape\" is not an array");
  std::uint64_t numel = 1;
  bool overflow = false;
  for (const auto& dim : shape) {
    bool ok = true;
    std::uint64_t s = read_u64(dim, ok);
    if (!ok || s > static_cast<std::uint64_t>(INT64_MAX))
      corrupt(source, where + ": shape " + shape.dump() + " has an entry that is not a non-negative integer");
    overflow = overflow || __builtin_mul_overflow(numel, s, &numel);
    e.shape.push_back(static_cast<std::int64_t>(s));
  }

  const OrderedJson& offs = v["data_offsets"];
  bool ok = offs.is_array() && offs.size() == 2;
  if (ok) {
    e.begin = read_u64(offs[0], ok);
    e.end = read_u64(offs[1], ok);
  }
  if (!ok) corrupt(source, where + ": \"data_offsets\" " + offs.dump() + " is not two non-negative integers");
  if (e.end < e.begin) corrupt(source, where + ": data_offsets " + offs.dump() + " end before they begin");

  std::uint64_t expected = 0;
  overflow = overflow || __builtin_mul_overflow(numel, c10::elementSize(e.type), &expected);
  if (overflow || expected != e.end - e.begin)
    corrupt(source, where + ": data_offsets " + offs.dump() + " hold " + std::to_string(e.end - e.begin) +
                        " bytes, but shape " + shape.dump() + " of " + d->name + " needs " +
                        (overflow ? std::string("more than 2^64") : std::to_string(expected)));
  return e;
}

}  // namespace

std::string to_safetensors_bytes(const NamedTensors& tensors, const std::map<std::string, std::string>& metadata) {
  std::string out;
  serialize(tensors, metadata, [&out](const void* p, std::size_t n) { out.append(static_cast<const char*>(p), n); });
  return out;
}

void save_safetensors(const std::filesystem::path& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata) {
  util::AtomicFile file(path);
  serialize(tensors, metadata, [&file](const void* p, std::size_t n) { file.write(p, n); });
  file.commit();
}

SafetensorsFile from_safetensors_bytes(std::string_view bytes, const std::string& source_name) {
  const std::string& src = source_name;
  if (bytes.size() < 8)
    corrupt(src, "file is " + std::to_string(bytes.size()) + " bytes, shorter than the 8-byte header length");
  std::uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);  // little-endian on disk and on the host
  if (n > kSafetensorsMaxHeaderBytes)
    corrupt(src, "header length " + std::to_string(n) + " exceeds the " + std::to_string(kSafetensorsMaxHeaderBytes) +
                     "-byte cap");
  if (n > bytes.size() - 8)
    corrupt(src, "header length " + std::to_string(n) + " is larger than the " + std::to_string(bytes.size() - 8) +
                     " bytes that follow it");
  const std::string_view header_text = bytes.substr(8, n);
  const std::string_view data = bytes.substr(8 + n);

  // nlohmann keeps the last of two equal keys silently; a duplicated tensor name is a corrupt file, so the
  // parse callback watches the top-level keys (depth 1).
  std::set<std::string> names;
  std::string duplicate;
  OrderedJson header;
  try {
    header = OrderedJson::parse(header_text, [&](int depth, OrderedJson::parse_event_t ev, OrderedJson& parsed) {
      if (ev == OrderedJson::parse_event_t::key && depth == 1 && parsed.is_string() &&
          !names.insert(parsed.get<std::string>()).second && duplicate.empty())
        duplicate = parsed.get<std::string>();
      return true;
    });
  } catch (const nlohmann::json::exception& e) {
    corrupt(src, std::string("header is not valid JSON: ") + e.what());
  }
  if (!duplicate.empty()) corrupt(src, "header names '" + duplicate + "' twice");
  if (!header.is_object()) corrupt(src, "header is not a JSON object");

  SafetensorsFile out;
  std::vector<Entry> entries;
  for (const auto& [key, value] : header.items()) {
    if (key == kMetadataKey) {
      if (!value.is_object()) corrupt(src, "\"__metadata__\" is not a JSON object");
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string()) corrupt(src, "metadata value for '" + mk + "' is not a string");
        out.metadata[mk] = mv.get<std::string>();
      }
      continue;
    }
    entries.push_back(parse_entry(src, key, value));
  }

  // Stable, so tensors at the same offset (empty ones) keep their header order; our writer lists tensors
  // in the order it was given, so files it wrote come back in that order.
  std::stable_sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) { return a.begin < b.begin; });
  std::uint64_t cursor = 0;
  for (const Entry& e : entries) {
    const std::string range = "[" + std::to_string(e.begin) + ", " + std::to_string(e.end) + "]";
    if (e.end > data.size())
      corrupt(src, "tensor '" + e.name + "': data_offsets " + range + " run past the " + std::to_string(data.size()) +
                       " data bytes in the file");
    if (e.begin < cursor)
      corrupt(src, "tensor '" + e.name + "': data_offsets " + range + " overlap the previous tensor, which ends at " +
                       std::to_string(cursor));
    if (e.begin > cursor)
      corrupt(src,
              "tensor '" + e.name + "': data_offsets " + range + " leave a hole after byte " + std::to_string(cursor));
    cursor = e.end;
  }
  if (cursor != data.size())
    corrupt(src, std::to_string(data.size() - cursor) + " data bytes after the last tensor belong to no tensor");

  if (auto it = out.metadata.find(std::string(kChecksumKey)); it != out.metadata.end()) {
    const auto actual = checksum_text(util::crc32c(data.data(), data.size()));
    if (it->second != actual)
      throw CheckpointError("safetensors file '" + src + "' is damaged: its data has CRC-32C " + actual +
                                " but the file was written with " + it->second,
                            "the bytes changed after the file was saved (disk, copy or transfer); use another "
                            "copy or checkpoint");
  }
  out.tensors.reserve(entries.size());
  for (const Entry& e : entries) {
    // A fresh tensor per entry: the result owns its memory and outlives `bytes`.
    at::Tensor t = at::empty(e.shape, at::TensorOptions().dtype(e.type).device(at::kCPU));
    if (e.end > e.begin) std::memcpy(t.data_ptr(), data.data() + e.begin, e.end - e.begin);
    out.tensors.emplace_back(e.name, std::move(t));
  }
  return out;
}

SafetensorsFile load_safetensors(const std::filesystem::path& path) {
  const std::string name = path.string();
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    throw CheckpointError("cannot open safetensors file '" + name + "': " + std::strerror(err),
                          err == ENOENT ? "check the path (ckpt.* or the weights option)" : "");
  }
  struct stat st {};
  std::string buffer;
  int err = 0;
  if (::fstat(fd, &st) != 0) {
    err = errno;
  } else {
    // One read of the whole file; the loop only continues when the kernel returns less than asked.
    buffer.resize(static_cast<std::size_t>(st.st_size));
    std::size_t done = 0;
    while (done < buffer.size()) {
      ssize_t r = ::read(fd, buffer.data() + done, buffer.size() - done);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) {
        err = errno;
        break;
      }
      if (r == 0) {  // the file shrank while we read it
        buffer.resize(done);
        break;
      }
      done += static_cast<std::size_t>(r);
    }
  }
  ::close(fd);
  if (err != 0) throw CheckpointError("cannot read safetensors file '" + name + "': " + std::strerror(err));
  return from_safetensors_bytes(buffer, name);
}

}  // namespace cohort::checkpoint

#include "cohort/log/TensorBoard.h"

#include <unistd.h>

#include <array>
#include <chrono>
#include <cstring>
#include <ctime>
#include <iostream>

#include "cohort/util/Crc32c.h"
#include "cohort/util/Error.h"

namespace cohort::log {
namespace {

// Protobuf wire format: a key is (field number << 3 | wire type); 0 varint, 1 fixed64, 2 length-
// delimited, 5 fixed32.
void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
template <class T>
void put_fixed(std::string& out, T v) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &v, sizeof(T));  // x86-64 and aarch64 Linux are little-endian, as the format is
  out.append(bytes, sizeof(T));
}
void put_bytes(std::string& out, int field, const std::string& bytes) {
  put_varint(out, (static_cast<uint64_t>(field) << 3) | 2);
  put_varint(out, bytes.size());
  out += bytes;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

uint32_t crc32c(const void* data, size_t n) { return util::crc32c(data, n); }

uint32_t masked_crc32c(const void* data, size_t n) {
  const uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xA282EAD8u;
}

std::string frame_record(const std::string& data) {
  std::string out;
  const uint64_t len = data.size();
  put_fixed(out, len);
  put_fixed(out, masked_crc32c(out.data(), sizeof len));
  out += data;
  put_fixed(out, masked_crc32c(data.data(), data.size()));
  return out;
}

std::string encode_file_version_event(double wall_time, const std::string& version) {
  std::string e;
  e.push_back(0x09);  // wall_time = 1, fixed64 double
  put_fixed(e, wall_time);
  put_bytes(e, 3, version);  // file_version = 3
  return e;
}

std::string encode_scalar_event(double wall_time, int64_t step, const std::string& tag, float value) {
  std::string v;
  put_bytes(v, 1, tag);  // Value.tag = 1
  v.push_back(0x15);     // Value.simple_value = 2, fixed32 float
  put_fixed(v, value);
  std::string summary;
  put_bytes(summary, 1, v);  // Summary.value = 1
  std::string e;
  e.push_back(0x09);
  put_fixed(e, wall_time);
  e.push_back(0x10);  // step = 2, varint
  put_varint(e, static_cast<uint64_t>(step));
  put_bytes(e, 5, summary);  // summary = 5
  return e;
}

EventWriter::EventWriter(const std::filesystem::path& dir) {
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  path_ = dir / ("events.out.tfevents." + std::to_string(static_cast<int64_t>(std::time(nullptr))) + "." + host + "." +
                 std::to_string(getpid()) + ".0");
  file_ = std::fopen(path_.c_str(), "wb");
  if (!file_)
    throw Error("cannot create TensorBoard event file " + path_.string() + ": " + std::strerror(errno),
                "check that the run directory is writable, or set log.tensorboard=false");
  const auto record = frame_record(encode_file_version_event(now_seconds(), "brain.Event:2"));
  std::fwrite(record.data(), 1, record.size(), file_);
  flush();
}

EventWriter::~EventWriter() {
  if (!file_) return;
  flush();
  std::fclose(file_);
}

void EventWriter::add_scalar(const std::string& tag, double value, int64_t step) {
  const auto record = frame_record(encode_scalar_event(now_seconds(), step, tag, static_cast<float>(value)));
  // Losing scalars (a full disk) must not stop training; say so once.
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size() && !warned_) {
    warned_ = true;
    std::cerr << "cohort: warning: cannot write to " << path_.string() << ": " << std::strerror(errno)
              << "; TensorBoard scalars from step " << step << " on may be missing" << std::endl;
  }
}

void EventWriter::flush() {
  std::fflush(file_);
  fsync(fileno(file_));
}

}  // namespace cohort::log

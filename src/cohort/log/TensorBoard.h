// TensorBoard event files written without TensorFlow or protobuf: scalars for `tensorboard --logdir`.
// A run directory gets one events.out.tfevents.<time>.<host>.<pid>.0 file: TFRecord framing (length,
// masked CRC-32C of the length, data, masked CRC-32C of the data) around serialized `Event` messages,
// the first one carrying file_version "brain.Event:2", as TensorFlow's own writer does.
//
//   cohort::log::EventWriter tb(run_dir);
//   tb.add_scalar("train/loss", 0.42, step);
//   tb.flush();                              // also on destruction
//
// Why our own code: cohort needs three message types and a checksum. Debian has no C++ CRC-32C library
// (FACTS.md), and protobuf with TensorBoard's .proto files would be a build dependency and a code
// generator for about a hundred lines of encoding.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>

namespace cohort::log {

// CRC-32C (Castagnoli), as TFRecord uses it; crc32c("123456789") == 0xE3069283.
uint32_t crc32c(const void* data, size_t n);
// TFRecord's masked CRC: ((c >> 15) | (c << 17)) + 0xA282EAD8.
uint32_t masked_crc32c(const void* data, size_t n);

// One TFRecord: u64 length, u32 masked CRC of the length bytes, the data, u32 masked CRC of the data
// (all little-endian).
std::string frame_record(const std::string& data);

// Serialized `Event` protos: {wall_time, step, file_version} and {wall_time, step, summary{value{tag,
// simple_value}}}.
std::string encode_file_version_event(double wall_time, const std::string& version);
std::string encode_scalar_event(double wall_time, int64_t step, const std::string& tag, float value);

class EventWriter {
 public:
  // Creates the event file in `dir` and writes the file_version event. Throws cohort::Error naming the
  // path when it cannot.
  explicit EventWriter(const std::filesystem::path& dir);
  ~EventWriter();
  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;

  void add_scalar(const std::string& tag, double value, int64_t step);
  // Makes what was written so far readable by TensorBoard (and durable against a crash of this process).
  void flush();
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  std::FILE* file_ = nullptr;
  bool warned_ = false;
};

}  // namespace cohort::log

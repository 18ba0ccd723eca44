// Reader for the IDX format that MNIST and Fashion-MNIST ship in: two zero bytes, a type byte, the number
// of dimensions, one big-endian 32-bit size per dimension, then the elements. Files may be gzip-compressed
// or raw; both read the same way, and every malformed file is a cohort::DataError naming the path.
//
//   cohort::data::IdxArray labels =
//       cohort::data::read_idx("/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz");
//   // labels.dims == {10000}; labels.data is a uint8 tensor of shape [10000]
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace cohort::data {

// The element type byte of an IDX file. Only unsigned bytes are read: every image and label file of the
// MNIST family uses them, and the other types (int8, int16, int32, float, double) would only add
// untested paths.
inline constexpr uint8_t kIdxTypeUint8 = 0x08;
// The most dimensions the format allows in practice (images are 3-d, labels 1-d).
inline constexpr int kIdxMaxDims = 4;
// Anything with 2^34 elements or more is a corrupt header, not a dataset: refuse it before allocating.
inline constexpr int64_t kIdxMaxElements = int64_t{1} << 34;
// Deflate cannot expand data more than 1032:1 (zlib's FAQ; a 258-byte match costs at least 2 bits), so a
// gzip file of N bytes holds at most 1032 N bytes: a header claiming more is refused before allocating.
inline constexpr int64_t kDeflateMaxRatio = 1032;

struct IdxArray {
  std::vector<int64_t> dims;  // as stored in the header, outermost first
  at::Tensor data;            // uint8, CPU, contiguous, shaped as dims (at::Tensor is torch::Tensor)
};

// Reads a whole IDX file. Throws cohort::DataError when the file is missing or unreadable, the magic or
// type is wrong, a dimension is zero or absurd, the data is shorter or longer than the header says, or
// the gzip stream is corrupt.
IdxArray read_idx(const std::filesystem::path& path);

// The same checks on a whole file already in memory, raw or gzip (the fuzzer's entry point; read_idx
// reads the file and calls it). `source_name` names the bytes in error messages, usually the path.
IdxArray read_idx_bytes(std::string_view bytes, const std::string& source_name);

}  // namespace cohort::data

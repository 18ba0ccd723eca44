// Reads and writes safetensors files, cohort's interchange format for weights and checkpoints.
//
// A file is a u64 little-endian header length N, N bytes of JSON (name -> dtype, shape, data_offsets, plus
// an optional "__metadata__" string map) padded with spaces to a multiple of 8, then the raw little-endian
// C-order bytes of every tensor (FACTS.md, "File formats"). Python's `safetensors` reads what we write and
// we read what it writes. Saving is atomic; loading validates the whole header before trusting it.
//
//   namespace ck = cohort::checkpoint;
//   ck::save_safetensors("model.safetensors", {{"fc.weight", w}, {"fc.bias", b}}, {{"step", "100"}});
//   ck::SafetensorsFile f = ck::load_safetensors("model.safetensors");
//   for (auto& [name, tensor] : f.tensors) ...;   // CPU tensors, in the order they were saved
#pragma once

#include <ATen/core/Tensor.h>

#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace cohort::checkpoint {

// at::Tensor and torch::Tensor are the same type; at:: keeps this header free of torch/torch.h.
using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;  // order preserved

struct SafetensorsFile {
  NamedTensors tensors;  // CPU, contiguous, each owning its memory; ascending data offset
  std::map<std::string, std::string> metadata;
};

// The reader refuses headers larger than this, so a corrupt length cannot make it allocate gigabytes.
inline constexpr std::uint64_t kSafetensorsMaxHeaderBytes = 100ull * 1000 * 1000;

// Writes atomically via util::AtomicFile. Tensors may be non-contiguous or on any device: each is copied
// to CPU contiguous memory one at a time while writing. Supported dtypes: F64 F32 F16 BF16 I64 I32 I16 I8
// U8 BOOL. Throws cohort::CheckpointError for an unsupported dtype, a duplicate name or an I/O failure.
void save_safetensors(const std::filesystem::path& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// Reads the whole file and validates it; throws cohort::CheckpointError naming the file and the problem.
SafetensorsFile load_safetensors(const std::filesystem::path& path);

// The same format in memory. `source_name` names the bytes in error messages (usually the file path).
std::string to_safetensors_bytes(const NamedTensors& tensors, const std::map<std::string, std::string>& metadata);
SafetensorsFile from_safetensors_bytes(std::string_view bytes, const std::string& source_name);

}  // namespace cohort::checkpoint

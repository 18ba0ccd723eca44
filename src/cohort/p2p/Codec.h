// How a swarm round puts a float32 vector on the wire: as it is (none), in half precision (fp16), or in
// int8 with one float32 scale per block of kInt8Block elements (INTELLECT-1's int8 all-reduce of DiLoCo's
// pseudo-gradients). The butterfly's parts start on block boundaries (part_bounds' `align`), so a part
// encodes exactly as the same elements of the whole vector would, and a sender's error feedback
// (values - roundtrip(values)) is what the wire lost.
//
//   auto bytes = p2p::encode(part, p2p::Codec::kInt8);
//   auto back = p2p::decode(bytes.data(), bytes.size(), part.numel(), p2p::Codec::kInt8);  // nullopt: malformed
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>

namespace cohort::p2p {

enum class Codec { kNone, kFp16, kInt8 };
constexpr int64_t kInt8Block = 1024;

// "none", "fp16", "int8"; throws ConfigError naming `key` otherwise.
Codec codec_from_name(const std::string& name, const std::string& key);
// Elements a part must start on a multiple of, so parts encode as the whole vector does.
int64_t codec_alignment(Codec codec);
// Bytes `numel` elements take on the wire.
int64_t encoded_bytes(int64_t numel, Codec codec);

std::vector<uint8_t> encode(const at::Tensor& values, Codec codec);
// The same, appended to `out` (after a header its caller wrote, say), saving a copy of a part.
void encode(const at::Tensor& values, Codec codec, std::vector<uint8_t>& out);
// Exactly `numel` float32 values from `size` bytes, or nullopt when the size is wrong or a scale is not finite.
std::optional<at::Tensor> decode(const uint8_t* data, size_t size, int64_t numel, Codec codec);
// The same into `out` (float32, contiguous: a slice of a flat vector, say) with no copy of its own; false
// when malformed, `out` then holding anything.
bool decode_into(const uint8_t* data, size_t size, const at::Tensor& out, Codec codec);
// decode(encode(values)): what a peer receives of `values`.
at::Tensor roundtrip(const at::Tensor& values, Codec codec);

// Error feedback (EF-SGD; INTELLECT-1's int8 all-reduce): returns `values` plus what the wire lost of the
// vector sent last time (`residual`), and sets `residual` to what it loses of this one, so that over
// steps the sum of what arrives stays within one step of the codec of the sum sent. `residual` starts
// undefined or zero; with kNone it returns `values` and leaves `residual` alone. The swarm's int8 gradients
// and DiLoCo's int8 pseudo-gradients go through it (Note [A swarm's int8 gradients carry what the wire lost]).
at::Tensor with_error_feedback(const at::Tensor& values, at::Tensor& residual, Codec codec);

}  // namespace cohort::p2p

#include "cohort/p2p/Codec.h"

#include <cmath>
#include <cstring>

#include "cohort/util/Error.h"

namespace cohort::p2p {

Codec codec_from_name(const std::string& name, const std::string& key) {
  if (name == "none") return Codec::kNone;
  if (name == "fp16") return Codec::kFp16;
  if (name == "int8") return Codec::kInt8;
  throw ConfigError(key + "=" + name + " is not a codec", "write none, fp16 or int8");
}

int64_t codec_alignment(Codec codec) { return codec == Codec::kInt8 ? kInt8Block : 1; }

int64_t encoded_bytes(int64_t numel, Codec codec) {
  switch (codec) {
    case Codec::kNone: return numel * 4;
    case Codec::kFp16: return numel * 2;
    case Codec::kInt8: return numel + 4 * ((numel + kInt8Block - 1) / kInt8Block);
  }
  return 0;
}

std::vector<uint8_t> encode(const at::Tensor& values, Codec codec) {
  std::vector<uint8_t> out;
  encode(values, codec, out);
  return out;
}

void encode(const at::Tensor& values, Codec codec, std::vector<uint8_t>& out) {
  const auto v = values.contiguous().to(at::kFloat);
  const int64_t n = v.numel();
  const size_t bytes = static_cast<size_t>(encoded_bytes(n, codec)), at = out.size();
  out.resize(at + bytes);
  uint8_t* const to = out.data() + at;
  if (codec == Codec::kNone) {
    std::memcpy(to, v.data_ptr<float>(), bytes);
  } else if (codec == Codec::kFp16) {
    // Clamped to half's range first: a value past 65504 would become inf, which decode refuses (and a
    // round would lose the whole part); the clamp keeps its sign and the most it can say.
    constexpr float kHalfMax = 65504.0f;
    const auto h = v.clamp(-kHalfMax, kHalfMax).to(at::kHalf).contiguous();
    std::memcpy(to, h.data_ptr(), bytes);
  } else {
    // Per block: the scale (max |x| / 127) first, then the block's int8 values rounded to nearest.
    const int64_t blocks = (n + kInt8Block - 1) / kInt8Block;
    const auto padded = at::zeros({blocks * kInt8Block}, at::kFloat);
    padded.slice(0, 0, n).copy_(v);
    const auto rows = padded.view({blocks, kInt8Block});
    auto scales = std::get<0>(rows.abs().max(1)).div_(127.0f);
    const auto safe = at::where(scales > 0, scales, at::ones_like(scales));
    const auto q = rows.div(safe.unsqueeze(1)).round_().clamp_(-127, 127).to(at::kChar).contiguous();
    std::memcpy(to, scales.contiguous().data_ptr<float>(), static_cast<size_t>(blocks) * 4);
    std::memcpy(to + blocks * 4, q.data_ptr<int8_t>(), static_cast<size_t>(n));
  }
}

std::optional<at::Tensor> decode(const uint8_t* data, size_t size, int64_t numel, Codec codec) {
  if (numel < 0) return std::nullopt;
  auto out = at::empty({numel}, at::kFloat);
  if (!decode_into(data, size, out, codec)) return std::nullopt;
  return out;
}

bool decode_into(const uint8_t* data, size_t size, const at::Tensor& out, Codec codec) {
  COHORT_ASSERT(out.scalar_type() == at::kFloat && out.is_contiguous(), "decode_into: a contiguous float32 tensor");
  const int64_t numel = out.numel();
  if (static_cast<int64_t>(size) != encoded_bytes(numel, codec)) return false;
  if (codec == Codec::kNone) {
    std::memcpy(out.data_ptr<float>(), data, size);
  } else if (codec == Codec::kFp16) {
    auto h = at::empty({numel}, at::kHalf);
    std::memcpy(h.data_ptr(), data, size);
    out.copy_(h);
  } else {
    const int64_t blocks = (numel + kInt8Block - 1) / kInt8Block;
    auto scales = at::empty({blocks}, at::kFloat);
    std::memcpy(scales.data_ptr<float>(), data, static_cast<size_t>(blocks) * 4);
    if (!at::isfinite(scales).all().item<bool>()) return false;
    auto q = at::zeros({blocks * kInt8Block}, at::kChar);
    std::memcpy(q.data_ptr<int8_t>(), data + blocks * 4, static_cast<size_t>(numel));
    const auto values = q.to(at::kFloat).view({blocks, kInt8Block}).mul_(scales.unsqueeze(1));
    out.copy_(values.view(-1).slice(0, 0, numel));
  }
  return at::isfinite(out).all().item<bool>();
}

at::Tensor roundtrip(const at::Tensor& values, Codec codec) {
  if (codec == Codec::kNone) return values.contiguous().to(at::kFloat);
  const auto bytes = encode(values, codec);
  return *decode(bytes.data(), bytes.size(), values.numel(), codec);
}

at::Tensor with_error_feedback(const at::Tensor& values, at::Tensor& residual, Codec codec) {
  if (codec == Codec::kNone) return values;
  auto sent = residual.defined() ? values + residual : values.to(at::kFloat).clone();
  residual = sent - roundtrip(sent, codec);
  return sent;
}

}  // namespace cohort::p2p

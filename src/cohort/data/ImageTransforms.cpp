// Over 450 lines on purpose: the one JPEG pipeline's transforms (resize with antialiasing, crops, flips,
// normalization) and the filters they share, each a short function.
// One file over 450 lines on purpose: the resize planner, its scalar and SSE4.1 loops and the two transforms
// that drive it are one concept (Pillow's fixed-point resampling), and each function fits on a screen.
#include "cohort/data/ImageTransforms.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <smmintrin.h>
#endif

#include "cohort/data/Jpeg.h"
#include "cohort/util/Error.h"

namespace cohort::data {
namespace {

// PIL's fixed-point precision for 8-bit resampling: 32 bits minus 8 for the pixel and 2 for the sum's
// headroom (Pillow's Resample.c).
constexpr int kPrecisionBits = 32 - 8 - 2;
constexpr int32_t kHalf = int32_t{1} << (kPrecisionBits - 1);
// Horizontal filters with up to this many taps (downscales up to about 3.5x) get the fixed-length loop.
constexpr int kMaxFixedTaps = 8;

inline uint8_t clip8(int32_t acc) {
  // Arithmetic shift then clamp, as PIL's clip8 table.
  return static_cast<uint8_t>(std::min(std::max(acc >> kPrecisionBits, 0), 255));
}

// PIL's BILINEAR filter: a triangle of support 1.
inline double triangle(double x) {
  x = std::fabs(x);
  return x < 1.0 ? 1.0 - x : 0.0;
}

// PIL's BICUBIC filter: Keys' cubic with a = -0.5 (PyTorch's non-antialiased bicubic uses -0.75), support 2.
inline double bicubic(double x) {
  constexpr double a = -0.5;
  x = std::fabs(x);
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
  if (x < 2.0) return (((x - 5.0) * x + 8.0) * x - 4.0) * a;
  return 0.0;
}

// Per-thread state of the transforms: the decoder keeps libjpeg's object, the rest keep their capacity.
struct Scratch {
  JpegDecoder decoder;
  RgbImage decoded;
  PilResize resize;
  std::vector<uint8_t> resized;
};

Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

}  // namespace

int round_half_even(double v) {
  double f = std::floor(v);
  const double d = v - f;
  if (d > 0.5 || (d == 0.5 && std::fmod(f, 2.0) != 0.0)) f += 1.0;
  return static_cast<int>(f);
}

CropBox random_resized_crop_params(int width, int height, util::Rng& rng, double scale_min, double scale_max,
                                   double ratio_min, double ratio_max) {
  const double area = static_cast<double>(width) * height;
  const double log_r0 = std::log(ratio_min), log_r1 = std::log(ratio_max);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target_area = area * (scale_min + (scale_max - scale_min) * rng.uniform());
    const double aspect = std::exp(log_r0 + (log_r1 - log_r0) * rng.uniform());
    const int w = round_half_even(std::sqrt(target_area * aspect));
    const int h = round_half_even(std::sqrt(target_area / aspect));
    if (0 < w && w <= width && 0 < h && h <= height) {
      CropBox b;
      b.top = static_cast<int>(rng.uniform_int(static_cast<uint64_t>(height - h + 1)));
      b.left = static_cast<int>(rng.uniform_int(static_cast<uint64_t>(width - w + 1)));
      b.height = h;
      b.width = w;
      return b;
    }
  }
  // Fallback: the central crop, the whole image clamped to the ratio range.
  const double in_ratio = static_cast<double>(width) / height;
  const double lo = std::min(ratio_min, ratio_max), hi = std::max(ratio_min, ratio_max);
  int w = width, h = height;
  if (in_ratio < lo) {
    h = round_half_even(w / lo);
  } else if (in_ratio > hi) {
    w = round_half_even(h * hi);
  }
  return CropBox{(height - h) / 2, (width - w) / 2, h, w};
}

std::pair<int, int> resize_shorter_side(int width, int height, int size) {
  // int(size * long / short) in Python is a float division truncated; the exact integer quotient is the
  // same number because the fraction is at least 1/short away from the next integer.
  if (width <= height) {
    return {size, static_cast<int>(static_cast<int64_t>(size) * height / width)};
  }
  return {static_cast<int>(static_cast<int64_t>(size) * width / height), size};
}

CropBox center_crop_box(int width, int height, int crop_w, int crop_h) {
  return CropBox{round_half_even((height - crop_h) / 2.0), round_half_even((width - crop_w) / 2.0), crop_h, crop_w};
}

// Pillow's precompute_coeffs + normalize_coeffs_8bpc for the output pixels [win0, win0 + win_n), with the
// taps then made relative to the first source pixel any of them reads ([lo, hi) on return).
void PilResize::plan_axis(Interpolation filter, int in_size, double in0_d, double in1_d, int out_size, int win0,
                          int win_n, Axis& a, int& lo, int& hi) {
  // PIL passes the box as float and subtracts in float.
  const float in0 = static_cast<float>(in0_d), in1 = static_cast<float>(in1_d);
  const double scale = static_cast<double>(in1 - in0) / out_size;
  const double filterscale = std::max(scale, 1.0);
  const bool cubic = filter == Interpolation::bicubic;
  const double support = (cubic ? 2.0 : 1.0) * filterscale;
  a.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  a.identity = out_size == in_size && in0 == 0.0f && in1 == static_cast<float>(in_size);
  a.first.assign(win_n, 0);
  a.count.assign(win_n, 0);
  a.coeff.assign(static_cast<size_t>(win_n) * a.ksize, 0);
  std::vector<double> k(a.ksize);
  lo = in_size;
  hi = 0;
  for (int i = 0; i < win_n; ++i) {
    const int xx = win0 + i;
    const double center = in0 + (xx + 0.5) * scale;
    const double ss = 1.0 / filterscale;
    const int xmin = std::max(0, static_cast<int>(center - support + 0.5));
    const int xmax = std::min(in_size, static_cast<int>(center + support + 0.5)) - xmin;
    double ww = 0.0;
    for (int x = 0; x < xmax; ++x) {
      const double t = (x + xmin - center + 0.5) * ss;
      k[x] = cubic ? bicubic(t) : triangle(t);
      ww += k[x];
    }
    int32_t* kk = a.coeff.data() + static_cast<size_t>(i) * a.ksize;
    for (int x = 0; x < xmax; ++x) {
      const double w = ww != 0.0 ? k[x] / ww : k[x];
      kk[x] = static_cast<int32_t>(w < 0 ? -0.5 + w * (1 << kPrecisionBits) : 0.5 + w * (1 << kPrecisionBits));
    }
    a.first[i] = xmin;
    a.count[i] = std::max(0, xmax);
    if (xmax > 0) {
      lo = std::min(lo, xmin);
      hi = std::max(hi, xmin + xmax);
    }
  }
  if (lo >= hi) lo = hi = 0;
  for (int i = 0; i < win_n; ++i) a.first[i] -= lo;
}

void PilResize::plan(int src_w, int src_h, const ResizeBox& box, int out_w, int out_h, CropBox window,
                     Interpolation filter) {
  if (window.width == 0 || window.height == 0) window = CropBox{0, 0, out_h, out_w};
  COHORT_ASSERT(src_w > 0 && src_h > 0 && out_w > 0 && out_h > 0, "resize of an empty image");
  COHORT_ASSERT(
      window.left >= 0 && window.top >= 0 && window.left + window.width <= out_w && window.top + window.height <= out_h,
      "resize window outside the output");
  int x_lo, x_hi, y_lo, y_hi;
  plan_axis(filter, src_w, box.x0, box.x1, out_w, window.left, window.width, h_, x_lo, x_hi);
  plan_axis(filter, src_h, box.y0, box.y1, out_h, window.top, window.height, v_, y_lo, y_hi);
  win_w_ = window.width;
  win_h_ = window.height;
  source_ = CropBox{y_lo, x_lo, y_hi - y_lo, x_hi - x_lo};
  COHORT_ASSERT(source_.width > 0 && source_.height > 0, "resize box reads no pixel of the source image");
  // Fixed-length horizontal taps: a pixel with fewer taps gets zero weights, placed after its own taps, or
  // before them at the right edge so that every read stays inside the source rect.
  const int taps = *std::max_element(h_.count.begin(), h_.count.end());
  h_.fixed_taps = taps <= kMaxFixedTaps && taps <= source_.width ? taps : 0;
  if (h_.fixed_taps > 0) {
    h_.fixed_first.resize(win_w_);
    h_.fixed_coeff.assign(static_cast<size_t>(win_w_) * taps, 0);
    for (int x = 0; x < win_w_; ++x) {
      const int start = std::min(h_.first[x], source_.width - taps);
      h_.fixed_first[x] = start;
      for (int t = 0; t < h_.count[x]; ++t) {
        h_.fixed_coeff[static_cast<size_t>(x) * taps + (h_.first[x] - start) + t] =
            h_.coeff[static_cast<size_t>(x) * h_.ksize + t];
      }
    }
  }
}

namespace {

// One row of the horizontal pass, Pillow's ImagingResampleHorizontal_8bpc for RGB.
inline void horizontal_row(const uint8_t* in, int n_out, const int* first, const int* count, const int32_t* coeff,
                           int ksize, uint8_t* out) {
  for (int x = 0; x < n_out; ++x) {
    const uint8_t* p = in + first[x] * 3;
    const int32_t* k = coeff + static_cast<size_t>(x) * ksize;
    int32_t s0 = kHalf, s1 = kHalf, s2 = kHalf;
    for (int t = 0, n = count[x]; t < n; ++t, p += 3) {
      s0 += p[0] * k[t];
      s1 += p[1] * k[t];
      s2 += p[2] * k[t];
    }
    out[3 * x + 0] = clip8(s0);
    out[3 * x + 1] = clip8(s1);
    out[3 * x + 2] = clip8(s2);
  }
}

// One output row of the vertical pass, tap-outer so the inner loops run along the row and vectorize
// (restrict: uint8_t stores could otherwise alias the accumulators).
inline void vertical_row(const uint8_t* rows, size_t stride, int count, const int32_t* k, size_t n,
                         int32_t* __restrict acc, uint8_t* __restrict out) {
  for (size_t i = 0; i < n; ++i) acc[i] = kHalf;
  for (int t = 0; t < count; ++t) {
    const uint8_t* __restrict r = rows + t * stride;
    const int32_t kt = k[t];
    for (size_t i = 0; i < n; ++i) acc[i] += r[i] * kt;
  }
  for (size_t i = 0; i < n; ++i) out[i] = clip8(acc[i]);
}

// COHORT_RESIZE_NO_SIMD builds only the portable loops (the unit tests are run that way too).
#if (defined(__x86_64__) || defined(__i386__)) && !defined(COHORT_RESIZE_NO_SIMD)
#define COHORT_RESIZE_SSE41 1

// The same arithmetic with SSE4.1 (pmovzxbd, pmulld), which the default x86-64 target lacks: chosen at run
// time, so the binary still runs on any x86-64. A pixel is one vector of four int32 lanes (R, G, B and the
// next pixel's R, ignored), loaded as 4 bytes: the caller guarantees one readable byte after each row.
// Stores write 4 bytes per pixel, the 4th overwritten by the next pixel: `out` has one spare byte.
__attribute__((target("sse4.1"))) void horizontal_row_sse41(const uint8_t* in, int n_out, const int* first,
                                                            const int* count, const int32_t* coeff, int ksize,
                                                            uint8_t* out) {
  for (int x = 0; x < n_out; ++x) {
    const uint8_t* p = in + first[x] * 3;
    const int32_t* k = coeff + static_cast<size_t>(x) * ksize;
    __m128i acc = _mm_set1_epi32(kHalf);
    for (int t = 0, n = count[x]; t < n; ++t, p += 3) {
      int32_t v;
      std::memcpy(&v, p, 4);
      acc = _mm_add_epi32(acc, _mm_mullo_epi32(_mm_cvtepu8_epi32(_mm_cvtsi32_si128(v)), _mm_set1_epi32(k[t])));
    }
    // Shift, then saturating packs: the same as clip8 on each lane.
    acc = _mm_srai_epi32(acc, kPrecisionBits);
    const __m128i packed = _mm_packus_epi16(_mm_packs_epi32(acc, acc), acc);
    const int32_t o = _mm_cvtsi128_si32(packed);
    std::memcpy(out + 3 * x, &o, 4);
  }
}

// horizontal_row_sse41 with K taps for every pixel: unrolled, without unpredictable branches.
template <int K>
__attribute__((target("sse4.1"))) void horizontal_row_fixed_sse41(const uint8_t* in, int n_out, const int* first,
                                                                  const int32_t* coeff, uint8_t* out) {
  for (int x = 0; x < n_out; ++x) {
    const uint8_t* p = in + first[x] * 3;
    const int32_t* k = coeff + static_cast<size_t>(x) * K;
    __m128i acc = _mm_set1_epi32(kHalf);
    for (int t = 0; t < K; ++t) {
      int32_t v;
      std::memcpy(&v, p + 3 * t, 4);
      acc = _mm_add_epi32(acc, _mm_mullo_epi32(_mm_cvtepu8_epi32(_mm_cvtsi32_si128(v)), _mm_set1_epi32(k[t])));
    }
    acc = _mm_srai_epi32(acc, kPrecisionBits);
    const __m128i packed = _mm_packus_epi16(_mm_packs_epi32(acc, acc), acc);
    const int32_t o = _mm_cvtsi128_si32(packed);
    std::memcpy(out + 3 * x, &o, 4);
  }
}

using FixedRowFn = void (*)(const uint8_t*, int, const int*, const int32_t*, uint8_t*);
constexpr FixedRowFn kFixedRowSse41[kMaxFixedTaps + 1] = {nullptr,
                                                          horizontal_row_fixed_sse41<1>,
                                                          horizontal_row_fixed_sse41<2>,
                                                          horizontal_row_fixed_sse41<3>,
                                                          horizontal_row_fixed_sse41<4>,
                                                          horizontal_row_fixed_sse41<5>,
                                                          horizontal_row_fixed_sse41<6>,
                                                          horizontal_row_fixed_sse41<7>,
                                                          horizontal_row_fixed_sse41<8>};

// 16 bytes of the row at a time with the accumulators in registers across all taps.
__attribute__((target("sse4.1"))) void vertical_row_sse41(const uint8_t* rows, size_t stride, int count,
                                                          const int32_t* k, size_t n, int32_t* acc, uint8_t* out) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m128i a0 = _mm_set1_epi32(kHalf), a1 = a0, a2 = a0, a3 = a0;
    for (int t = 0; t < count; ++t) {
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows + t * stride + i));
      const __m128i kt = _mm_set1_epi32(k[t]);
      a0 = _mm_add_epi32(a0, _mm_mullo_epi32(_mm_cvtepu8_epi32(v), kt));
      a1 = _mm_add_epi32(a1, _mm_mullo_epi32(_mm_cvtepu8_epi32(_mm_srli_si128(v, 4)), kt));
      a2 = _mm_add_epi32(a2, _mm_mullo_epi32(_mm_cvtepu8_epi32(_mm_srli_si128(v, 8)), kt));
      a3 = _mm_add_epi32(a3, _mm_mullo_epi32(_mm_cvtepu8_epi32(_mm_srli_si128(v, 12)), kt));
    }
    const __m128i lo = _mm_packs_epi32(_mm_srai_epi32(a0, kPrecisionBits), _mm_srai_epi32(a1, kPrecisionBits));
    const __m128i hi = _mm_packs_epi32(_mm_srai_epi32(a2, kPrecisionBits), _mm_srai_epi32(a3, kPrecisionBits));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm_packus_epi16(lo, hi));
  }
  if (i < n) vertical_row(rows + i, stride, count, k, n - i, acc, out + i);
}

bool has_sse41() {
  static const bool yes = __builtin_cpu_supports("sse4.1");
  return yes;
}
#endif

}  // namespace

void PilResize::run(const uint8_t* src, size_t src_stride, uint8_t* dst) {
  const size_t row_bytes = static_cast<size_t>(win_w_) * 3;
#ifdef COHORT_RESIZE_SSE41
  const bool sse41 = has_sse41();
#endif
  // Horizontal pass first, over the source rows the vertical pass reads, rounded to uint8 in between
  // exactly as Pillow's ImagingResampleInner does.
  const uint8_t* rows = src;
  size_t rows_stride = src_stride;
  if (!h_.identity) {
    tmp_.resize(row_bytes * source_.height + 4);  // + the spare byte horizontal_row_sse41 may write
    for (int y = 0; y < source_.height; ++y) {
      const uint8_t* in = src + y * src_stride;
      uint8_t* out = tmp_.data() + y * row_bytes;
#ifdef COHORT_RESIZE_SSE41
      if (sse41) {
        if (y + 1 == source_.height) {
          // The last row has no readable byte after it in the caller's buffer: use a padded copy.
          last_row_.assign(in, in + static_cast<size_t>(source_.width) * 3);
          last_row_.resize(last_row_.size() + 4, 0);
          in = last_row_.data();
        }
        if (h_.fixed_taps > 0) {
          kFixedRowSse41[h_.fixed_taps](in, win_w_, h_.fixed_first.data(), h_.fixed_coeff.data(), out);
        } else {
          horizontal_row_sse41(in, win_w_, h_.first.data(), h_.count.data(), h_.coeff.data(), h_.ksize, out);
        }
        continue;
      }
#endif
      horizontal_row(in, win_w_, h_.first.data(), h_.count.data(), h_.coeff.data(), h_.ksize, out);
    }
    rows = tmp_.data();
    rows_stride = row_bytes;
  }
  if (v_.identity) {
    for (int y = 0; y < win_h_; ++y) std::memcpy(dst + y * row_bytes, rows + v_.first[y] * rows_stride, row_bytes);
    return;
  }
  acc_.resize(row_bytes);
  for (int y = 0; y < win_h_; ++y) {
    const int32_t* k = v_.coeff.data() + static_cast<size_t>(y) * v_.ksize;
    const uint8_t* base = rows + v_.first[y] * rows_stride;
    uint8_t* out = dst + y * row_bytes;
#ifdef COHORT_RESIZE_SSE41
    if (sse41) {
      vertical_row_sse41(base, rows_stride, v_.count[y], k, row_bytes, acc_.data(), out);
      continue;
    }
#endif
    vertical_row(base, rows_stride, v_.count[y], k, row_bytes, acc_.data(), out);
  }
}

void normalize_to_chw(const uint8_t* rgb, int width, int height, bool flip, const std::array<float, 3>& mean,
                      const std::array<float, 3>& std, float* out) {
  // ToTensor divides by 255 and Normalize subtracts and divides, each in float32: a table per channel
  // gives the same bits for a fraction of the work.
  float lut[3][256];
  for (int c = 0; c < 3; ++c) {
    for (int v = 0; v < 256; ++v) lut[c][v] = (static_cast<float>(v) / 255.0f - mean[c]) / std[c];
  }
  // One pass over the pixels writing the three planes (the RGB bytes are read once, in order).
  const size_t plane = static_cast<size_t>(width) * height;
  float* __restrict r_out = out;
  float* __restrict g_out = out + plane;
  float* __restrict b_out = out + 2 * plane;
  for (int y = 0; y < height; ++y) {
    const uint8_t* row = rgb + static_cast<size_t>(y) * width * 3;
    const size_t o = static_cast<size_t>(y) * width;
    for (int x = 0; x < width; ++x) {
      const uint8_t* px = row + 3 * (flip ? width - 1 - x : x);
      r_out[o + x] = lut[0][px[0]];
      g_out[o + x] = lut[1][px[1]];
      b_out[o + x] = lut[2][px[2]];
    }
  }
}

namespace {

// Decodes the source pixels `plan` reads from the scale-`m` image, where the plan's source starts at
// (origin_x, origin_y), then resizes them into s.resized.
void decode_and_resize(Scratch& s, int m, int origin_x, int origin_y, const TransformOptions& o) {
  const CropBox& r = s.resize.source_rect();
  JpegDecodeOptions d;
  d.scale_eighths = m;
  d.x = origin_x + r.left;
  d.y = origin_y + r.top;
  d.width = r.width;
  d.height = r.height;
  d.fast_idct = o.fast_idct;
  d.strict = o.strict;
  s.decoder.decode(d, s.decoded);
  s.resized.resize(static_cast<size_t>(s.resize.out_width()) * s.resize.out_height() * 3);
  s.resize.run(s.decoded.pixels.data(), static_cast<size_t>(s.decoded.width) * 3, s.resized.data());
}

}  // namespace

TransformTrace train_transform(const uint8_t* jpeg, size_t size, uint64_t seed, const TransformOptions& o, float* out) {
  Scratch& s = scratch();
  const JpegHeader h = s.decoder.open(jpeg, size, o.strict);
  util::Rng rng(seed);
  TransformTrace tr;
  tr.crop = random_resized_crop_params(h.width, h.height, rng, o.scale_min, o.scale_max, o.ratio_min, o.ratio_max);
  tr.flipped = rng.uniform() < o.flip_probability;
  const CropBox& c = tr.crop;
  const int m = o.dct_scaling ? choose_jpeg_scale(c.width, c.height, o.crop_size, o.crop_size) : 8;
  tr.scale_eighths = m;
  // The crop in the scaled image's coordinates (libjpeg's scaled IDCT maps each 8x8 block to m x m
  // pixels, so full-size edge coordinate x is x * m / 8 there), inside the whole scaled pixels covering it.
  // torchvision crops before resizing, so the filter must not read outside the crop: the plan's source
  // image is that rectangle, not the whole scaled image. At m == 8 this is exactly crop + resize.
  const double f = m / 8.0;
  const double x0 = c.left * f, x1 = (c.left + c.width) * f;
  const double y0 = c.top * f, y1 = (c.top + c.height) * f;
  const int ix0 = static_cast<int>(std::floor(x0)), iy0 = static_cast<int>(std::floor(y0));
  const int ix1 = std::min(static_cast<int>(std::ceil(x1)), jpeg_scaled_size(h.width, m));
  const int iy1 = std::min(static_cast<int>(std::ceil(y1)), jpeg_scaled_size(h.height, m));
  s.resize.plan(ix1 - ix0, iy1 - iy0, ResizeBox{x0 - ix0, y0 - iy0, x1 - ix0, y1 - iy0}, o.crop_size, o.crop_size,
                CropBox{}, o.interpolation);
  decode_and_resize(s, m, ix0, iy0, o);
  normalize_to_chw(s.resized.data(), o.crop_size, o.crop_size, tr.flipped, o.mean, o.std, out);
  return tr;
}

TransformTrace val_transform(const uint8_t* jpeg, size_t size, const TransformOptions& o, float* out) {
  Scratch& s = scratch();
  const JpegHeader h = s.decoder.open(jpeg, size, o.strict);
  const auto [rw, rh] = resize_shorter_side(h.width, h.height, o.resize_size);
  TransformTrace tr;
  tr.crop = center_crop_box(rw, rh, o.crop_size, o.crop_size);
  if (tr.crop.top < 0 || tr.crop.left < 0) {
    // torchvision would pad; ImageNet's val transform never gets here (resize_size >= crop_size).
    throw DataError("val transform: crop_size " + std::to_string(o.crop_size) + " is larger than the resized " +
                        std::to_string(rw) + "x" + std::to_string(rh) + " image",
                    "make the resize size (256 for ImageNet) at least the crop size");
  }
  // Decoding at scale m keeps the resize a reduction (as it is from full size) while the scaled image
  // still has at least rw x rh pixels: the center crop then has at least crop_size of them.
  const int m = o.dct_scaling ? choose_jpeg_scale(h.width, h.height, rw, rh) : 8;
  tr.scale_eighths = m;
  const double f = m / 8.0;
  s.resize.plan(jpeg_scaled_size(h.width, m), jpeg_scaled_size(h.height, m),
                ResizeBox{0.0, 0.0, h.width * f, h.height * f}, rw, rh, tr.crop, o.interpolation);
  decode_and_resize(s, m, 0, 0, o);
  normalize_to_chw(s.resized.data(), o.crop_size, o.crop_size, false, o.mean, o.std, out);
  return tr;
}

}  // namespace cohort::data

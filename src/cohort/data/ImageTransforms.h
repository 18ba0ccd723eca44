// The ImageNet train and val transforms of torchvision, as pure C++ from JPEG bytes to a normalized float
// CHW image in a caller's buffer (the caller wraps it in a tensor). Train is RandomResizedCrop + random
// horizontal flip + ToTensor + Normalize; val is Resize(256) + CenterCrop(224) + ToTensor + Normalize.
// Crop parameters follow torchvision's RandomResizedCrop.get_params and the resize is PIL's BILINEAR or
// BICUBIC (antialiased filters, Pillow's fixed-point arithmetic and uint8 rounding), so an image decoded
// at full size gives torchvision+PIL's output bit for bit. With DCT scaling on (the default) an image whose
// crop is at least twice the output size is decoded at 1/2, 1/4 or 1/8 scale instead, within a grey level
// or so of PIL. Only the rows (and roughly the columns) the crop needs are decoded.
//
//   std::vector<float> x(3 * 224 * 224);
//   cohort::data::TransformOptions opt;                 // ImageNet defaults
//   cohort::data::train_transform(bytes, n, cohort::util::mix_seed(seed, epoch, index), opt, x.data());
//   cohort::data::val_transform(bytes, n, opt, x.data());
//
// Thread-safe: each thread keeps its own decoder and scratch buffers.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "cohort/util/Rng.h"

namespace cohort::data {

// A rectangle in pixels, in torchvision's (top, left, height, width) order.
struct CropBox {
  int top = 0;
  int left = 0;
  int height = 0;
  int width = 0;
};

// PIL's resampling filters that torchvision's and timm's presets use on PIL images.
enum class Interpolation { bilinear, bicubic };

struct TransformOptions {
  int crop_size = 224;                                  // side of the square output, train and val
  int resize_size = 256;                                // val: the shorter side after Resize, before CenterCrop
  double scale_min = 0.08, scale_max = 1.0;             // RandomResizedCrop: fraction of the area
  double ratio_min = 3.0 / 4.0, ratio_max = 4.0 / 3.0;  // RandomResizedCrop: aspect ratio w / h
  double flip_probability = 0.5;
  std::array<float, 3> mean{0.485f, 0.456f, 0.406f};
  std::array<float, 3> std{0.229f, 0.224f, 0.225f};
  Interpolation interpolation = Interpolation::bilinear;  // of every resize, train and val
  // Decode at a reduced libjpeg scale when it still covers the output; false decodes full size, which
  // reproduces torchvision+PIL exactly and is slower.
  bool dct_scaling = true;
  bool fast_idct = false;  // see Note [Choice of the IDCT] in Jpeg.cpp
  bool strict = true;      // see Note [libjpeg warnings are errors] in Jpeg.cpp
};

// What a transform did, for tests and logging.
struct TransformTrace {
  CropBox crop;  // in full-size source pixels (val: in the resized image)
  bool flipped = false;
  int scale_eighths = 8;  // the libjpeg scale the image was decoded at
};

// Python's round() (half to even), which torchvision's crop arithmetic uses.
int round_half_even(double v);

// torchvision's RandomResizedCrop.get_params on a width x height image: 10 tries of an area uniform in
// [scale_min, scale_max] * area and a log-uniform ratio, then the central crop clamped to the ratio range.
CropBox random_resized_crop_params(int width, int height, util::Rng& rng, double scale_min, double scale_max,
                                   double ratio_min, double ratio_max);

// torchvision's Resize(size) with an int size: the shorter side becomes `size`, the longer
// int(size * long / short). Returns {width, height}.
std::pair<int, int> resize_shorter_side(int width, int height, int size);

// torchvision's CenterCrop position: top = int(round((height - crop_h) / 2.0)), left likewise.
CropBox center_crop_box(int width, int height, int crop_w, int crop_h);

// A source box in PIL's edge coordinates (pixel x covers [x, x + 1)); may be fractional.
struct ResizeBox {
  double x0 = 0, y0 = 0, x1 = 0, y1 = 0;
};

// PIL's Image.resize((out_w, out_h), BILINEAR or BICUBIC, box) of an RGB image, computed only for the part
// `window` of the output (identical to resizing everything and cropping). Planned once per image: the plan
// says which source pixels are read, so the caller decodes only those. Reuse one object to reuse its memory.
class PilResize {
 public:
  // `window` with zero width means the whole output.
  void plan(int src_w, int src_h, const ResizeBox& box, int out_w, int out_h, CropBox window = {},
            Interpolation filter = Interpolation::bilinear);
  // The source pixels the output reads; run() takes a pointer to its top-left pixel.
  const CropBox& source_rect() const { return source_; }
  int out_width() const { return win_w_; }
  int out_height() const { return win_h_; }
  // Writes out_height() rows of 3 * out_width() bytes to dst.
  void run(const uint8_t* src, size_t src_stride, uint8_t* dst);

 private:
  struct Axis {
    int ksize = 0;               // taps per output pixel, zero-padded
    std::vector<int> first;      // first tap, relative to the source rect
    std::vector<int> count;      // taps used
    std::vector<int32_t> coeff;  // ksize per output pixel, fixed point (PIL's 22 bits)
    bool identity = false;       // PIL skips the pass when it is the identity
    // The same taps with one length for all output pixels (the most any uses, zero weights added inside
    // the source), so the SIMD horizontal loop has a fixed trip count; fixed_taps == 0 when not built.
    int fixed_taps = 0;
    std::vector<int> fixed_first;
    std::vector<int32_t> fixed_coeff;
  };
  static void plan_axis(Interpolation filter, int in_size, double in0, double in1, int out_size, int win0, int win_n,
                        Axis& a, int& lo, int& hi);
  Axis h_, v_;
  CropBox source_;
  int win_w_ = 0, win_h_ = 0;
  std::vector<uint8_t> tmp_;
  std::vector<int32_t> acc_;
  std::vector<uint8_t> last_row_;
};

// ToTensor + Normalize with an optional horizontal flip: out[c][y][x] = (rgb[y][x'][c] / 255 - mean[c]) /
// std[c] in float32 arithmetic as torchvision's, x' = width - 1 - x when flipped.
void normalize_to_chw(const uint8_t* rgb, int width, int height, bool flip, const std::array<float, 3>& mean,
                      const std::array<float, 3>& std, float* out);

// RandomResizedCrop(crop_size) + RandomHorizontalFlip + ToTensor + Normalize of one JPEG. `seed` decides
// crop and flip (pass mix_seed(seed, epoch, index)); `out` holds 3 * crop_size * crop_size floats.
// Throws cohort::DataError for a corrupt file (the caller adds its name).
TransformTrace train_transform(const uint8_t* jpeg, size_t size, uint64_t seed, const TransformOptions& options,
                               float* out);

// Resize(resize_size) + CenterCrop(crop_size) + ToTensor + Normalize of one JPEG into `out`.
TransformTrace val_transform(const uint8_t* jpeg, size_t size, const TransformOptions& options, float* out);

}  // namespace cohort::data

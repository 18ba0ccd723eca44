// JPEG decoding for the image-folder pipeline, over libjpeg-turbo, to 8-bit RGB: grayscale and CMYK/YCCK
// files are converted to RGB the way PIL's `Image.open(f).convert("RGB")` does. Decoding can use libjpeg's
// DCT-domain scaling (scale 1/8 .. 8/8, far cheaper than decoding full size and shrinking) and can stop at a
// rectangle of the scaled image, so a crop decodes only the rows and (roughly) the columns it needs.
//
//   cohort::data::JpegDecoder dec;                       // one per thread; reusable across files
//   cohort::data::JpegHeader h = dec.open(bytes, n);     // header only: size, components
//   cohort::data::JpegDecodeOptions o;
//   o.scale_eighths = cohort::data::choose_jpeg_scale(h.width, h.height, 256, 256);
//   cohort::data::RgbImage img;
//   dec.decode(o, img);                                  // img.width == jpeg_scaled_size(h.width, o.scale_eighths)
//
// Every failure (not a JPEG, truncated, corrupt, unsupported) is a cohort::DataError naming what went wrong;
// the caller adds the file name. See Note [libjpeg warnings are errors].
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace cohort::data {

// Images with more pixels than this are refused before allocating: a corrupt header, not a photograph.
inline constexpr int64_t kJpegMaxPixels = int64_t{1} << 28;

struct JpegHeader {
  int width = 0;  // full-size pixels
  int height = 0;
  int components = 0;  // 1 (grayscale), 3 (YCbCr or RGB) or 4 (CMYK or YCCK)
};

// A packed RGB image: `pixels` holds height rows of 3 * width bytes.
struct RgbImage {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> pixels;
  const uint8_t* row(int y) const { return pixels.data() + static_cast<size_t>(y) * 3 * width; }
};

struct JpegDecodeOptions {
  // Decode at scale_eighths / 8 of the full size (libjpeg's scale_num / scale_denom), 1..8.
  int scale_eighths = 8;
  // The rectangle of the *scaled* image to return; width == 0 or height == 0 means the whole image.
  int x = 0, y = 0, width = 0, height = 0;
  // JDCT_IFAST instead of JDCT_ISLOW. ISLOW is what PIL uses; see the note in Jpeg.cpp on the choice.
  bool fast_idct = false;
  // Treat libjpeg warnings (premature end of data, corrupt entropy data) as errors. See
  // Note [libjpeg warnings are errors].
  bool strict = true;
};

// The size libjpeg produces for `size` full-size pixels at scale eighths/8: ceil(size * eighths / 8).
int jpeg_scaled_size(int size, int eighths);

// The smallest scale eighths/8 among 1/8, 1/4, 1/2 and 1 at which a source region of region_w x region_h
// full-size pixels still covers at least need_w x need_h pixels, so the resize that follows never enlarges
// what a full-size decode would have shrunk; 8 when only full size does. The other scales are slower
// than full size in libjpeg-turbo (Note [Only power-of-two DCT scales] in Jpeg.cpp) but decode() takes any.
int choose_jpeg_scale(double region_w, double region_h, int need_w, int need_h);

// A libjpeg decompressor kept across files (one per thread: not thread-safe). open() reads the header only;
// decode() then decodes the image whose bytes were given to open(), which must still be alive.
class JpegDecoder {
 public:
  JpegDecoder();
  ~JpegDecoder();
  JpegDecoder(const JpegDecoder&) = delete;
  JpegDecoder& operator=(const JpegDecoder&) = delete;

  // `strict` applies to the header (see JpegDecodeOptions::strict); decode() takes its own.
  JpegHeader open(const uint8_t* data, size_t size, bool strict = true);
  // Decodes into `out` (its buffer is reused). Throws cohort::DataError on corrupt data, and
  // std::logic_error (COHORT_ASSERT) when the options do not fit the image, a caller bug.
  void decode(const JpegDecodeOptions& options, RgbImage& out);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// One-shot helpers over a temporary JpegDecoder.
JpegHeader read_jpeg_header(const uint8_t* data, size_t size);
RgbImage decode_jpeg(const uint8_t* data, size_t size, const JpegDecodeOptions& options = {});

}  // namespace cohort::data

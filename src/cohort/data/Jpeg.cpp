#include "cohort/data/Jpeg.h"

#include <algorithm>
#include <csetjmp>
#include <cstdio>
#include <string>

// jpeglib.h needs size_t and FILE declared before it.
#include <jpeglib.h>

#include "cohort/util/Error.h"

// Note [libjpeg warnings are errors]
// libjpeg reports a file that ends early or has damaged entropy-coded data as a *warning* and carries on,
// filling the rest with grey or garbage. PIL refuses truncated files and torchvision would train on the
// garbage, neither of which we want silently: in strict mode (the default) the first warning aborts the
// decode with a DataError and the caller decides to skip the file or fail. A decode that stops early
// (a crop that ends above the last row) never reads the tail, so strict mode also requires an EOI marker
// after the start of the scan data: entropy-coded data cannot contain the bytes FF D9, so a file cut
// anywhere in its scans has none.

// Note [Choice of the IDCT]
// JDCT_ISLOW is the default: it is what PIL decodes with, so a full-size decode gives PIL's pixels exactly
// (the unit tests check this), and with libjpeg-turbo's SIMD it is within 5% of JDCT_IFAST on whole
// 500x375 decodes (1.10 against 1.05 ms), too little to give up the exactness for. The reduced-size IDCTs
// that DCT scaling uses ignore dct_method. `fast_idct` is there for measurements. Fancy upsampling of
// chroma stays on for the same reason (PIL's default; merged upsampling measured 6% faster).

// Note [Only power-of-two DCT scales]
// libjpeg-turbo has SIMD IDCTs for the scales 1/8 (DC only), 1/4, 1/2 and 1; 3/8, 5/8, 6/8 and 7/8 use plain C
// IDCTs (and scale chroma up through 10x10..14x14 ones) and measured *slower* than a full-size decode on
// 500x375 quality-90 files (full 1.11 ms, 4/8 0.97, 5/8 1.18, 6/8 1.27, 7/8 1.50 ms per image), so
// choose_jpeg_scale picks among 1/8, 1/4, 1/2 and full size only. Entropy decoding, which no scale
// reduces, is most of the cost at these sizes.

namespace cohort::data {
namespace {

// Columns decoded on each side of a requested region; see JpegDecoder::decode.
constexpr int kCropPad = 2;

constexpr const char* kHint =
    "the file is damaged or not a JPEG: re-download or re-convert it (e.g. `convert in.png out.jpg`), or "
    "let the loader skip unreadable files";

// libjpeg's error manager extended with a jump target and the formatted message. libjpeg's default
// error_exit calls exit(); ours jumps back to guarded() instead, which unwinds nothing but C frames.
struct ErrorManager {
  jpeg_error_mgr pub;
  std::jmp_buf jump;
  bool strict = true;
  char message[JMSG_LENGTH_MAX] = {};
};

extern "C" void cohort_jpeg_error_exit(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<ErrorManager*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

// Level -1 is a warning (see Note [libjpeg warnings are errors]); levels >= 0 are trace messages, dropped.
extern "C" void cohort_jpeg_emit_message(j_common_ptr cinfo, int msg_level) {
  auto* err = reinterpret_cast<ErrorManager*>(cinfo->err);
  if (msg_level >= 0) return;
  cinfo->err->num_warnings++;
  if (err->strict) cohort_jpeg_error_exit(cinfo);
}

// Runs `body` (libjpeg calls only) with the jump target set. `body` and this function must hold nothing
// with a destructor: a longjmp out of libjpeg skips destructors, which is fine only for trivial objects.
// Never inlined, so the jump target stays in a frame of its own (compilers refuse to inline setjmp anyway).
template <typename Body>
__attribute__((noinline)) bool guarded(ErrorManager& err, Body&& body) {
  if (setjmp(err.jump) != 0) return false;
  body();
  return true;
}

// PIL's CMYK to RGB ("CMYK;I" unpacking, then cmyk2rgb): PIL assumes Adobe's inverted polarity for every
// CMYK JPEG, so the stored value v means ink 255 - v.
inline uint8_t cmyk_channel(uint8_t stored_ink, uint8_t stored_k) {
  const int ink = 255 - stored_ink;
  const int nk = stored_k;  // 255 - (255 - stored_k)
  const int t = ink * nk + 128;
  const int v = nk - (((t >> 8) + t) >> 8);
  return static_cast<uint8_t>(std::clamp(v, 0, 255));
}

void cmyk_row_to_rgb(const uint8_t* in, int width, uint8_t* out) {
  for (int x = 0; x < width; ++x, in += 4, out += 3) {
    out[0] = cmyk_channel(in[0], in[3]);
    out[1] = cmyk_channel(in[1], in[3]);
    out[2] = cmyk_channel(in[2], in[3]);
  }
}

}  // namespace

struct JpegDecoder::State {
  jpeg_decompress_struct cinfo;
  ErrorManager err;
  bool created = false;
  bool opened = false;
  const uint8_t* data = nullptr;
  size_t size = 0;
  size_t scan_offset = 0;  // where the first scan's entropy-coded data starts
  std::vector<uint8_t> row_buffer;
  std::vector<JSAMPROW> rows;

  [[noreturn]] void fail() {
    const std::string what = std::string("JPEG decode failed: ") + err.message;
    // Frees the image's memory and leaves the object ready for the next open().
    jpeg_abort_decompress(&cinfo);
    opened = false;
    throw DataError(what, kHint);
  }

  bool has_eoi_after_scan() const {
    for (size_t p = size; p >= scan_offset + 2; --p) {
      if (data[p - 2] == 0xFF && data[p - 1] == 0xD9) return true;
    }
    return false;
  }
};

int jpeg_scaled_size(int size, int eighths) { return static_cast<int>((static_cast<int64_t>(size) * eighths + 7) / 8); }

int choose_jpeg_scale(double region_w, double region_h, int need_w, int need_h) {
  // See Note [Only power-of-two DCT scales].
  for (int m : {1, 2, 4}) {
    if (region_w * m / 8.0 >= need_w && region_h * m / 8.0 >= need_h) return m;
  }
  return 8;
}

JpegDecoder::JpegDecoder() : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.cinfo.err = jpeg_std_error(&s.err.pub);
  s.err.pub.error_exit = cohort_jpeg_error_exit;
  s.err.pub.emit_message = cohort_jpeg_emit_message;
  if (!guarded(s.err, [&] { jpeg_create_decompress(&s.cinfo); })) {
    throw DataError(std::string("cannot create a JPEG decoder: ") + s.err.message);
  }
  s.created = true;
}

JpegDecoder::~JpegDecoder() {
  if (state_ && state_->created) jpeg_destroy_decompress(&state_->cinfo);
}

JpegHeader JpegDecoder::open(const uint8_t* data, size_t size, bool strict) {
  State& s = *state_;
  // Drops whatever the previous image left (a decode stopped early, a failed one); cheap when nothing is.
  jpeg_abort_decompress(&s.cinfo);
  s.opened = false;
  if (data == nullptr || size == 0) throw DataError("not a JPEG: the file is empty (0 bytes)", kHint);
  s.data = data;
  s.size = size;
  s.err.strict = strict;
  s.err.pub.num_warnings = 0;
  jpeg_decompress_struct& c = s.cinfo;
  if (!guarded(s.err, [&] {
        jpeg_mem_src(&c, data, static_cast<unsigned long>(size));
        jpeg_read_header(&c, TRUE);
      })) {
    s.fail();
  }
  JpegHeader h;
  h.width = static_cast<int>(c.image_width);
  h.height = static_cast<int>(c.image_height);
  h.components = c.num_components;
  if (static_cast<int64_t>(h.width) * h.height > kJpegMaxPixels) {
    jpeg_abort_decompress(&c);
    throw DataError("JPEG header says " + std::to_string(h.width) + "x" + std::to_string(h.height) +
                        " pixels, more than the limit of " + std::to_string(kJpegMaxPixels),
                    kHint);
  }
  if (h.components != 1 && h.components != 3 && h.components != 4) {
    jpeg_abort_decompress(&c);
    throw DataError("JPEG with " + std::to_string(h.components) +
                        " color components is not supported (only gray, RGB/YCbCr and CMYK/YCCK)",
                    kHint);
  }
  // jpeg_read_header stops right after the SOS marker segment: the scan data starts here.
  s.scan_offset = static_cast<size_t>(c.src->next_input_byte - data);
  s.opened = true;
  return h;
}

void JpegDecoder::decode(const JpegDecodeOptions& o, RgbImage& out) {
  State& s = *state_;
  COHORT_ASSERT(s.opened, "JpegDecoder::decode() without a successful open()");
  COHORT_ASSERT(o.scale_eighths >= 1 && o.scale_eighths <= 8, "JPEG scale must be 1..8 eighths");
  s.opened = false;  // one decode per open()
  jpeg_decompress_struct& c = s.cinfo;
  s.err.strict = o.strict;
  const bool cmyk = c.jpeg_color_space == JCS_CMYK || c.jpeg_color_space == JCS_YCCK;
  c.out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
  c.scale_num = static_cast<unsigned>(o.scale_eighths);
  c.scale_denom = 8;
  c.dct_method = o.fast_idct ? JDCT_IFAST : JDCT_ISLOW;
  c.do_fancy_upsampling = TRUE;  // as PIL
  if (!guarded(s.err, [&] { jpeg_calc_output_dimensions(&c); })) s.fail();
  const int full_w = static_cast<int>(c.output_width);
  const int full_h = static_cast<int>(c.output_height);
  const bool whole = o.width == 0 || o.height == 0;
  const int rx = whole ? 0 : o.x, ry = whole ? 0 : o.y;
  const int rw = whole ? full_w : o.width, rh = whole ? full_h : o.height;
  if (rx < 0 || ry < 0 || rw <= 0 || rh <= 0 || rx + rw > full_w || ry + rh > full_h) {
    jpeg_abort_decompress(&c);
    COHORT_ASSERT(false, "JPEG decode region " + std::to_string(rx) + "," + std::to_string(ry) + " " +
                             std::to_string(rw) + "x" + std::to_string(rh) + " outside the " + std::to_string(full_w) +
                             "x" + std::to_string(full_h) + " scaled image");
  }

  if (!guarded(s.err, [&] { jpeg_start_decompress(&c); })) s.fail();
  // jpeg_crop_scanline widens the column range to iMCU boundaries; `skip` is where ours starts in it.
  // Fancy upsampling of subsampled chroma reads one chroma sample beyond each pixel's own, and at a crop
  // edge libjpeg replicates instead: two more columns on each side keep our columns equal to the full
  // decode's (the unit tests compare them).
  const int pad_lo = std::min(rx, kCropPad), pad_hi = std::min(full_w - rx - rw, kCropPad);
  JDIMENSION crop_x = static_cast<JDIMENSION>(rx - pad_lo);
  JDIMENSION crop_w = static_cast<JDIMENSION>(rw + pad_lo + pad_hi);
  if (static_cast<int>(crop_w) < full_w) {
    if (!guarded(s.err, [&] { jpeg_crop_scanline(&c, &crop_x, &crop_w); })) s.fail();
  }
  const int skip = rx - static_cast<int>(crop_x);
  if (ry > 0) {
    // Skipped rows are entropy-decoded (there is no other way to find where later rows start) but not
    // IDCT'd, upsampled or color-converted.
    if (!guarded(s.err, [&] { jpeg_skip_scanlines(&c, static_cast<JDIMENSION>(ry)); })) s.fail();
  }

  out.width = rw;
  out.height = rh;
  out.pixels.resize(static_cast<size_t>(rw) * rh * 3);
  const size_t out_stride = static_cast<size_t>(rw) * 3;
  // Rows go straight into `out` when libjpeg's rows are ours; otherwise through a buffer of a few rows.
  const bool direct = !cmyk && skip == 0 && static_cast<int>(c.output_width) == rw;
  const int components = cmyk ? 4 : 3;
  const int batch = std::max(1, c.rec_outbuf_height);
  const size_t in_stride = static_cast<size_t>(c.output_width) * components;
  if (!direct) s.row_buffer.resize(in_stride * batch);
  s.rows.resize(batch);
  int done = 0;
  while (done < rh) {
    const int want = std::min(batch, rh - done);
    for (int k = 0; k < want; ++k) {
      s.rows[k] = direct ? out.pixels.data() + (done + k) * out_stride : s.row_buffer.data() + k * in_stride;
    }
    JDIMENSION got = 0;
    if (!guarded(s.err, [&] { got = jpeg_read_scanlines(&c, s.rows.data(), static_cast<JDIMENSION>(want)); })) {
      s.fail();
    }
    if (got == 0) {
      jpeg_abort_decompress(&c);
      throw DataError("JPEG decode failed: no more rows after " + std::to_string(ry + done), kHint);
    }
    if (!direct) {
      for (JDIMENSION k = 0; k < got; ++k) {
        const uint8_t* src = s.row_buffer.data() + k * in_stride + static_cast<size_t>(skip) * components;
        uint8_t* dst = out.pixels.data() + (done + k) * out_stride;
        if (cmyk) {
          cmyk_row_to_rgb(src, rw, dst);
        } else {
          std::copy(src, src + out_stride, dst);
        }
      }
    }
    done += static_cast<int>(got);
  }

  if (c.output_scanline < c.output_height) {
    // Stopped above the last row: nothing below is read. See Note [libjpeg warnings are errors].
    jpeg_abort_decompress(&c);
    if (o.strict && !s.has_eoi_after_scan()) {
      throw DataError("JPEG decode failed: the file is truncated (no end-of-image marker after the scan data)", kHint);
    }
    return;
  }
  if (!guarded(s.err, [&] { jpeg_finish_decompress(&c); })) s.fail();
}

JpegHeader read_jpeg_header(const uint8_t* data, size_t size) {
  JpegDecoder dec;
  return dec.open(data, size);
}

RgbImage decode_jpeg(const uint8_t* data, size_t size, const JpegDecodeOptions& options) {
  JpegDecoder dec;
  dec.open(data, size, options.strict);
  RgbImage img;
  dec.decode(options, img);
  return img;
}

}  // namespace cohort::data

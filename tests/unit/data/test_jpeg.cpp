// JPEG decoding and the ImageNet transforms. Test images are generated and encoded here with libjpeg; the
// known answers from PIL 9.4 + torchvision 0.14 were computed once from the same files (set
// COHORT_JPEG_TEST_DUMP=DIR to write them, then run the snippet next to kPilVal below).
#include <gtest/gtest.h>
#include <jpeglib.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "cohort/data/ImageTransforms.h"
#include "cohort/data/Jpeg.h"
#include "cohort/util/Error.h"
#include "cohort/util/Rng.h"
#include "support/JpegFiles.h"

namespace cohort::data {
namespace {

using cohort::testing::encode_jpeg;

// Smooth ramps in R and G and a gentle 2-d wave in B: JPEG keeps it well, and a resize has real work to do.
std::vector<uint8_t> gradient_rgb(int w, int h) {
  std::vector<uint8_t> p(static_cast<size_t>(w) * h * 3);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      uint8_t* q = &p[(static_cast<size_t>(y) * w + x) * 3];
      q[0] = static_cast<uint8_t>(255 * x / (w - 1));
      q[1] = static_cast<uint8_t>(255 * y / (h - 1));
      q[2] = static_cast<uint8_t>(std::lround(128 + 60 * std::sin(x * 0.07) * std::cos(y * 0.05)));
    }
  }
  return p;
}

const std::vector<uint8_t>& test_jpeg() {  // 500x375, quality 90, 4:2:0
  static const std::vector<uint8_t> j = encode_jpeg(gradient_rgb(500, 375), 500, 375, 3, JCS_RGB, 90);
  return j;
}

const std::vector<uint8_t>& large_jpeg() {  // 1000x750: large enough for the transforms to decode at 1/2
  static const std::vector<uint8_t> j = encode_jpeg(gradient_rgb(1000, 750), 1000, 750, 3, JCS_RGB, 90);
  return j;
}

void maybe_dump(const char* name, const std::vector<uint8_t>& bytes) {
  const char* dir = std::getenv("COHORT_JPEG_TEST_DUMP");
  if (dir == nullptr) return;
  std::ofstream(std::string(dir) + "/" + name, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// Recovers the uint8 image a transform normalized (exact: the float error is far below half a level).
std::vector<int> denormalize(const std::vector<float>& chw, int size, const TransformOptions& o) {
  std::vector<int> hwc(static_cast<size_t>(size) * size * 3);
  for (int c = 0; c < 3; ++c) {
    for (int i = 0; i < size * size; ++i) {
      hwc[i * 3 + c] = static_cast<int>(std::lround((chw[c * size * size + i] * o.std[c] + o.mean[c]) * 255.0f));
    }
  }
  return hwc;
}

// PIL samples: pixel (y, x) = (14 + 28 i, 14 + 28 j), i, j in 0..7, RGB, and the mean of the whole
// 224x224x3 uint8 result. Computed with
//   im = Image.open(DIR + '/gradient.jpg').convert('RGB')
//   val = T.CenterCrop(224)(T.Resize(256)(im))
//   train = T.functional.resized_crop(im, 25, 8, 329, 367, [224, 224])   # the crop seed 8 draws
//   a = numpy.asarray(val); print([int(v) for i in range(8) for j in range(8) for v in a[14+28*i, 14+28*j]])
// and the same for gradient_large.jpg with the crop seed 13 draws there: (68, 363, 515, 556).
const int kPilVal[192] = {
    54,  30,  96,  73,  30,  156, 96,  30,  106, 116, 30,  138, 137, 29,  128, 158, 29,  121, 179, 30,  144, 200,
    30,  103, 54,  57,  103, 74,  58,  145, 97,  57,  112, 118, 58,  136, 138, 56,  128, 158, 58,  123, 179, 57,
    139, 200, 57,  110, 54,  85,  183, 75,  86,  83,  96,  85,  162, 117, 85,  108, 139, 86,  132, 158, 86,  141,
    178, 86,  99,  201, 85,  166, 53,  114, 101, 75,  113, 150, 96,  113, 112, 117, 114, 136, 137, 113, 127, 158,
    113, 122, 179, 113, 141, 201, 113, 109, 54,  142, 100, 74,  142, 153, 96,  141, 109, 117, 142, 138, 138, 142,
    128, 158, 141, 121, 180, 141, 144, 200, 141, 108, 54,  168, 183, 75,  169, 84,  96,  170, 160, 116, 169, 107,
    139, 169, 132, 158, 170, 139, 178, 169, 100, 201, 169, 169, 54,  197, 106, 74,  197, 144, 96,  197, 116, 117,
    198, 134, 137, 197, 125, 158, 197, 123, 181, 197, 138, 200, 198, 113, 53,  225, 93,  75,  226, 156, 97,  225,
    106, 117, 226, 141, 138, 226, 125, 158, 225, 120, 178, 225, 145, 200, 225, 101};
const double kPilValMean = 127.04931308460884;
const int kPilTrain[192] = {
    16, 31,  94,  40, 31,  158, 63, 30,  100, 87, 31,  155, 109, 32,  103, 133, 31,  150, 158, 31,  109, 179, 32,  145,
    16, 59,  112, 38, 59,  142, 63, 58,  113, 86, 58,  142, 109, 58,  115, 132, 59,  140, 156, 58,  116, 180, 59,  137,
    15, 88,  177, 38, 87,  83,  62, 87,  169, 85, 86,  88,  109, 88,  164, 133, 87,  95,  155, 87,  158, 179, 87,  101,
    15, 115, 101, 39, 115, 154, 63, 114, 106, 86, 115, 150, 109, 115, 106, 132, 115, 148, 155, 114, 109, 179, 115, 143,
    15, 143, 105, 39, 142, 149, 62, 142, 108, 85, 143, 145, 108, 142, 110, 131, 143, 145, 156, 142, 114, 180, 142, 140,
    15, 171, 177, 38, 171, 81,  63, 171, 170, 86, 171, 89,  108, 171, 165, 133, 171, 95,  157, 171, 158, 178, 171, 100,
    15, 199, 104, 40, 200, 149, 62, 199, 108, 87, 199, 147, 109, 199, 111, 132, 199, 145, 156, 200, 114, 179, 199, 139,
    15, 226, 100, 40, 228, 153, 62, 227, 105, 85, 228, 149, 109, 227, 105, 132, 228, 147, 157, 227, 111, 178, 228, 144};
const double kPilTrainMean = 117.80434869260205;
constexpr uint64_t kTrainSeed = 8;

const int kPilLargeVal[192] = {
    53,  29,  116, 74,  30,  113, 95,  30,  114, 116, 30,  118, 136, 30,  126, 159, 29,  134, 180, 30,  141, 201,
    30,  144, 54,  58,  98,  74,  58,  92,  95,  57,  94,  117, 58,  104, 138, 57,  123, 158, 58,  143, 179, 59,
    160, 200, 58,  166, 54,  86,  173, 74,  86,  186, 96,  86,  184, 118, 86,  164, 138, 85,  136, 159, 85,  106,
    179, 86,  79,  201, 85,  70,  53,  113, 105, 74,  114, 97,  95,  114, 99,  117, 114, 107, 139, 113, 125, 159,
    113, 140, 179, 114, 153, 200, 114, 159, 56,  141, 108, 75,  141, 103, 95,  141, 105, 118, 142, 112, 138, 141,
    124, 159, 141, 137, 178, 142, 147, 200, 141, 153, 53,  170, 171, 75,  169, 187, 96,  169, 183, 117, 169, 164,
    137, 169, 136, 159, 169, 107, 179, 169, 81,  199, 169, 71,  54,  198, 94,  75,  198, 86,  95,  197, 88,  117,
    197, 100, 138, 197, 122, 159, 197, 145, 180, 197, 162, 201, 197, 170, 54,  225, 120, 74,  225, 118, 95,  225,
    119, 117, 225, 123, 138, 226, 126, 159, 225, 132, 180, 226, 135, 200, 225, 138};
const double kPilLargeValMean = 127.20000265731292;
const int kPilLargeTrain[192] = {
    102, 34,  135, 120, 33,  148, 137, 34,  127, 155, 33,  110, 172, 33,  125, 190, 34,  145, 208, 34,  137, 225,
    34,  114, 102, 56,  120, 118, 56,  103, 137, 56,  129, 154, 56,  150, 172, 56,  132, 190, 56,  106, 208, 55,
    118, 225, 56,  146, 101, 78,  138, 119, 78,  155, 135, 77,  127, 155, 77,  102, 171, 78,  123, 190, 77,  154,
    208, 78,  142, 225, 78,  108, 102, 99,  117, 119, 100, 97,  137, 100, 132, 154, 100, 158, 172, 100, 135, 189,
    99,  99,  208, 100, 113, 225, 100, 153, 101, 122, 141, 119, 121, 162, 137, 121, 125, 155, 121, 93,  172, 122,
    121, 191, 121, 161, 207, 122, 147, 227, 122, 101, 102, 143, 112, 119, 144, 90,  137, 143, 131, 154, 144, 167,
    172, 144, 136, 190, 144, 92,  207, 144, 107, 225, 143, 158, 101, 164, 143, 119, 165, 170, 137, 165, 125, 154,
    165, 86,  172, 165, 120, 190, 165, 168, 207, 165, 151, 225, 165, 93,  103, 187, 110, 119, 187, 83,  137, 187,
    132, 154, 187, 175, 172, 186, 139, 189, 187, 85,  208, 186, 104, 225, 187, 164};
const double kPilLargeTrainMean = 133.71176791028913;
constexpr uint64_t kLargeTrainSeed = 13;

// The largest difference between a 224x224 result and PIL's samples.
int max_sample_diff(const std::vector<int>& hwc, const int* expected) {
  int worst = 0;
  for (int i = 0; i < 8; ++i)
    for (int j = 0; j < 8; ++j)
      for (int c = 0; c < 3; ++c)
        worst =
            std::max(worst, std::abs(hwc[((14 + 28 * i) * 224 + 14 + 28 * j) * 3 + c] - expected[(i * 8 + j) * 3 + c]));
  return worst;
}

double mean_of(const std::vector<int>& v) {
  double s = 0;
  for (int x : v) s += x;
  return s / v.size();
}

}  // namespace

TEST(Jpeg, HeaderAndFullDecodeMatchSource) {
  const auto src = gradient_rgb(500, 375);
  const auto& jpg = test_jpeg();
  maybe_dump("gradient.jpg", jpg);
  maybe_dump("gradient_large.jpg", large_jpeg());
  const JpegHeader h = read_jpeg_header(jpg.data(), jpg.size());
  EXPECT_EQ(h.width, 500);
  EXPECT_EQ(h.height, 375);
  EXPECT_EQ(h.components, 3);
  const RgbImage img = decode_jpeg(jpg.data(), jpg.size());
  ASSERT_EQ(img.width, 500);
  ASSERT_EQ(img.height, 375);
  double err = 0;
  for (size_t i = 0; i < src.size(); ++i) err += std::abs(int(src[i]) - int(img.pixels[i]));
  EXPECT_LT(err / src.size(), 1.5);  // quality 90 on smooth content
}

TEST(Jpeg, GrayscaleAndCmykBecomeRgb) {
  std::vector<uint8_t> gray(120 * 80);
  for (int y = 0; y < 80; ++y)
    for (int x = 0; x < 120; ++x) gray[y * 120 + x] = static_cast<uint8_t>(x * 2 + y);
  const auto gj = encode_jpeg(gray, 120, 80, 1, JCS_GRAYSCALE, 95);
  const RgbImage g = decode_jpeg(gj.data(), gj.size());
  ASSERT_EQ(g.width, 120);
  double err = 0;
  for (int i = 0; i < 120 * 80; ++i) {
    EXPECT_EQ(g.pixels[i * 3], g.pixels[i * 3 + 1]);
    EXPECT_EQ(g.pixels[i * 3], g.pixels[i * 3 + 2]);
    err += std::abs(int(g.pixels[i * 3]) - int(gray[i]));
  }
  EXPECT_LT(err / gray.size(), 1.0);

  // Flat CMYK inks, stored inverted as Adobe (and PIL) expect; PIL's cmyk2rgb gives the RGB.
  const uint8_t ink[4] = {10, 20, 30, 40};
  std::vector<uint8_t> cmyk(64 * 48 * 4);
  for (size_t i = 0; i < cmyk.size(); ++i) cmyk[i] = static_cast<uint8_t>(255 - ink[i % 4]);
  const auto cj = encode_jpeg(cmyk, 64, 48, 4, JCS_CMYK, 95);
  EXPECT_EQ(read_jpeg_header(cj.data(), cj.size()).components, 4);
  const RgbImage c = decode_jpeg(cj.data(), cj.size());
  ASSERT_EQ(c.width, 64);
  const int expected[3] = {207, 198, 190};  // PIL: Image.new('CMYK', (1, 1), (10, 20, 30, 40)).convert('RGB')
  for (int i = 0; i < 64 * 48; ++i)
    for (int k = 0; k < 3; ++k) EXPECT_NEAR(c.pixels[i * 3 + k], expected[k], 2);
  // Through the transforms (region decode of CMYK rows, upscaling to 224).
  TransformOptions o;
  std::vector<float> out(3 * 224 * 224);
  train_transform(cj.data(), cj.size(), 1, o, out.data());
  const auto hwc = denormalize(out, 224, o);
  for (int i = 0; i < 224 * 224; ++i)
    for (int k = 0; k < 3; ++k) ASSERT_NEAR(hwc[i * 3 + k], expected[k], 2);
}

TEST(Jpeg, ScaleChoice) {
  EXPECT_EQ(jpeg_scaled_size(375, 4), 188);  // ceil(375 / 2)
  EXPECT_EQ(jpeg_scaled_size(500, 8), 500);
  EXPECT_EQ(choose_jpeg_scale(500, 375, 180, 180), 4);   // 1/2 suffices: 187.5 >= 180
  EXPECT_EQ(choose_jpeg_scale(500, 375, 90, 90), 2);     // 1/4: 93.75 >= 90
  EXPECT_EQ(choose_jpeg_scale(500, 375, 224, 224), 8);   // 4/8 gives 187.5 < 224; 5/8 to 7/8 are not used
  EXPECT_EQ(choose_jpeg_scale(150, 150, 224, 224), 8);   // smaller than needed: full size
  EXPECT_EQ(choose_jpeg_scale(1000, 750, 341, 256), 4);  // val's Resize(256) of 1000x750
  EXPECT_EQ(choose_jpeg_scale(2000, 1500, 341, 256), 2);
  EXPECT_EQ(choose_jpeg_scale(4000, 3000, 341, 256), 1);
}

TEST(Jpeg, ScaledDecodeIsADownscaledImage) {
  const auto src = gradient_rgb(500, 375);
  const auto& jpg = test_jpeg();
  JpegDecodeOptions o;
  o.scale_eighths = 4;
  const RgbImage half = decode_jpeg(jpg.data(), jpg.size(), o);
  ASSERT_EQ(half.width, 250);
  ASSERT_EQ(half.height, 188);
  double err = 0;
  int n = 0;
  for (int y = 0; y < 187; ++y) {
    for (int x = 0; x < 250; ++x) {
      for (int c = 0; c < 3; ++c) {
        int box = 0;
        for (int k = 0; k < 4; ++k) box += src[((2 * y + k / 2) * 500 + 2 * x + k % 2) * 3 + c];
        err += std::abs(half.pixels[(y * 250 + x) * 3 + c] - box / 4.0);
        ++n;
      }
    }
  }
  EXPECT_LT(err / n, 1.5);
}

TEST(Jpeg, RegionDecodeEqualsCropOfFullDecode) {
  const auto src = gradient_rgb(500, 375);
  for (bool progressive : {false, true}) {
    const auto jpg = encode_jpeg(src, 500, 375, 3, JCS_RGB, 90, progressive);
    for (int m : {8, 6, 4, 3}) {
      JpegDecodeOptions o;
      o.scale_eighths = m;
      const RgbImage full = decode_jpeg(jpg.data(), jpg.size(), o);
      JpegDecoder dec;
      std::vector<CropBox> regions = {CropBox{53, 37, 77, 101}, CropBox{0, 1, 5, 9},
                                      CropBox{9, 17, full.height - 9, 33}, CropBox{30, 0, 100, full.width}};
      util::Rng rng(util::mix_seed(m, progressive));
      for (int k = 0; k < 12; ++k) {
        CropBox r;
        r.width = 1 + static_cast<int>(rng.uniform_int(full.width));
        r.height = 1 + static_cast<int>(rng.uniform_int(full.height));
        r.left = static_cast<int>(rng.uniform_int(full.width - r.width + 1));
        r.top = static_cast<int>(rng.uniform_int(full.height - r.height + 1));
        regions.push_back(r);
      }
      for (const CropBox& r : regions) {
        dec.open(jpg.data(), jpg.size());
        o.x = r.left, o.y = r.top, o.width = r.width, o.height = r.height;
        RgbImage part;
        dec.decode(o, part);
        ASSERT_EQ(part.width, r.width);
        ASSERT_EQ(part.height, r.height);
        int mismatches = 0;
        for (int y = 0; y < r.height; ++y)
          mismatches += std::memcmp(part.row(y), full.row(r.top + y) + 3 * r.left, 3 * r.width) != 0;
        EXPECT_EQ(mismatches, 0) << "scale " << m << "/8, progressive " << progressive << ", region " << r.left << ","
                                 << r.top << " " << r.width << "x" << r.height;
      }
    }
  }
}

TEST(Jpeg, CorruptInputsAreDataErrors) {
  const auto& jpg = test_jpeg();
  auto expect_data_error = [](const std::vector<uint8_t>& bytes, const char* what) {
    EXPECT_THROW(decode_jpeg(bytes.data(), bytes.size()), DataError) << what;
    TransformOptions o;
    std::vector<float> out(3 * 224 * 224);
    for (uint64_t seed = 0; seed < 8; ++seed)
      EXPECT_THROW(train_transform(bytes.data(), bytes.size(), seed, o, out.data()), DataError) << what;
    EXPECT_THROW(val_transform(bytes.data(), bytes.size(), o, out.data()), DataError) << what;
  };
  expect_data_error({}, "empty");
  expect_data_error(std::vector<uint8_t>(jpg.begin(), jpg.begin() + jpg.size() / 2), "truncated in the scan");
  expect_data_error(std::vector<uint8_t>(jpg.begin(), jpg.begin() + 300), "truncated in the header");
  expect_data_error(std::vector<uint8_t>(jpg.begin(), jpg.end() - 2), "no EOI marker");
  const std::vector<uint8_t> png = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n', 0, 0, 0, 13, 'I',  'H',  'D',  'R', 0,
                                    0,    1,   0,   0,   0,    1,    0,    8,    2, 0, 0, 0,  0x12, 0x34, 0x56, 0x78};
  expect_data_error(png, "PNG");
  util::Rng rng(123);
  std::vector<uint8_t> noise(4096);
  for (auto& b : noise) b = static_cast<uint8_t>(rng.next_u64());
  expect_data_error(noise, "random bytes");
  noise[0] = 0xFF, noise[1] = 0xD8;  // a JPEG signature followed by garbage
  expect_data_error(noise, "SOI then random bytes");
  try {
    decode_jpeg(png.data(), png.size());
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("Not a JPEG file"), std::string::npos) << e.what();
  }
  // Bytes between the scan data and the EOI marker: libjpeg only warns ("Corrupt JPEG data: N extraneous
  // bytes before marker 0xd9"), which strict mode (the default) makes an error. (The Huffman decoder reads a
  // few bytes ahead and drops them silently, hence 100.)
  std::vector<uint8_t> extra(jpg.begin(), jpg.end() - 2);
  extra.insert(extra.end(), 100, 0x01);
  extra.insert(extra.end(), {0xFF, 0xD9});
  try {
    decode_jpeg(extra.data(), extra.size());
    ADD_FAILURE() << "extraneous bytes were accepted in strict mode";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("extraneous bytes"), std::string::npos) << e.what();
  }
  JpegDecodeOptions lenient;
  lenient.strict = false;
  EXPECT_EQ(decode_jpeg(extra.data(), extra.size(), lenient).width, 500);
  // Damaged entropy data: an error or (rarely) a clean decode, never a crash; the decoder stays usable.
  JpegDecoder dec;
  for (int k = 0; k < 20; ++k) {
    std::vector<uint8_t> bad = jpg;
    for (int i = 0; i < 8; ++i) bad[700 + rng.uniform_int(bad.size() - 800)] = static_cast<uint8_t>(rng.next_u64());
    RgbImage img;
    try {
      dec.open(bad.data(), bad.size());
      dec.decode({}, img);
    } catch (const DataError&) {
    }
  }
  dec.open(jpg.data(), jpg.size());
  RgbImage img;
  dec.decode({}, img);
  EXPECT_EQ(img.width, 500);
}

TEST(ImageTransforms, RandomResizedCropParams) {
  for (auto [w, h] : {std::pair{500, 375}, std::pair{375, 500}, std::pair{224, 224}, std::pair{1000, 300}}) {
    for (uint64_t seed = 0; seed < 2000; ++seed) {
      util::Rng rng(util::mix_seed(seed, w, h));
      const CropBox b = random_resized_crop_params(w, h, rng, 0.08, 1.0, 3.0 / 4, 4.0 / 3);
      ASSERT_GE(b.top, 0);
      ASSERT_GE(b.left, 0);
      ASSERT_GT(b.width, 0);
      ASSERT_GT(b.height, 0);
      ASSERT_LE(b.top + b.height, h);
      ASSERT_LE(b.left + b.width, w);
      // w and h are rounded from sqrt(area * ratio), sqrt(area / ratio): allow half a pixel on each.
      const double area = double(w) * h;
      EXPECT_GE((b.width + 0.5) * (b.height + 0.5), 0.08 * area);
      EXPECT_LE((b.width - 0.5) * (b.height - 0.5), area);
      EXPECT_GE((b.width + 0.5) / (b.height - 0.5), 3.0 / 4 - 1e-9);
      EXPECT_LE((b.width - 0.5) / (b.height + 0.5), 4.0 / 3 + 1e-9);
    }
  }
  // No try fits a 1000x10 strip: torchvision's fallback is the central crop at the largest ratio.
  util::Rng rng(1);
  CropBox b = random_resized_crop_params(1000, 10, rng, 0.08, 1.0, 3.0 / 4, 4.0 / 3);
  EXPECT_EQ(b.top, 0);
  EXPECT_EQ(b.height, 10);
  EXPECT_EQ(b.width, 13);  // round(10 * 4 / 3)
  EXPECT_EQ(b.left, 493);  // (1000 - 13) // 2
  b = random_resized_crop_params(10, 1000, rng, 0.08, 1.0, 3.0 / 4, 4.0 / 3);
  EXPECT_EQ(b.width, 10);
  EXPECT_EQ(b.height, 13);  // round(10 / (3 / 4))
  EXPECT_EQ(b.top, 493);
}

TEST(ImageTransforms, RoundingAndSizesAsTorchvision) {
  EXPECT_EQ(round_half_even(58.5), 58);
  EXPECT_EQ(round_half_even(59.5), 60);
  EXPECT_EQ(round_half_even(-0.5), 0);
  EXPECT_EQ(round_half_even(2.4999), 2);
  EXPECT_EQ(resize_shorter_side(500, 375, 256), (std::pair<int, int>{341, 256}));
  EXPECT_EQ(resize_shorter_side(375, 500, 256), (std::pair<int, int>{256, 341}));
  EXPECT_EQ(resize_shorter_side(300, 300, 256), (std::pair<int, int>{256, 256}));
  const CropBox c = center_crop_box(341, 256, 224, 224);
  EXPECT_EQ(c.left, 58);  // int(round(58.5)) with Python's round
  EXPECT_EQ(c.top, 16);
}

TEST(ImageTransforms, NormalizeAndFlip) {
  const uint8_t rgb[2 * 3] = {0, 128, 255, 255, 0, 10};  // two pixels in one row
  TransformOptions o;
  float out[6], flipped[6];
  normalize_to_chw(rgb, 2, 1, false, o.mean, o.std, out);
  normalize_to_chw(rgb, 2, 1, true, o.mean, o.std, flipped);
  EXPECT_FLOAT_EQ(out[0], -0.485f / 0.229f);          // R of pixel 0 = 0
  EXPECT_FLOAT_EQ(out[1], (1.0f - 0.485f) / 0.229f);  // R of pixel 1 = 255
  EXPECT_FLOAT_EQ(out[2], (128 / 255.0f - 0.456f) / 0.224f);
  EXPECT_FLOAT_EQ(out[5], (10 / 255.0f - 0.406f) / 0.225f);
  EXPECT_NEAR(out[0], -2.1179, 1e-4);
  EXPECT_NEAR(out[1], 2.2489, 1e-4);
  for (int c = 0; c < 3; ++c) {
    EXPECT_EQ(flipped[c * 2], out[c * 2 + 1]);
    EXPECT_EQ(flipped[c * 2 + 1], out[c * 2]);
  }
}

TEST(ImageTransforms, TrainIsDeterministicBySeedAndFlips) {
  const auto& jpg = test_jpeg();
  TransformOptions o;
  std::vector<float> a(3 * 224 * 224), b(a.size());
  int flips = 0;
  for (uint64_t i = 0; i < 16; ++i) {
    const uint64_t seed = util::mix_seed(42, 3, i);
    const TransformTrace ta = train_transform(jpg.data(), jpg.size(), seed, o, a.data());
    const TransformTrace tb = train_transform(jpg.data(), jpg.size(), seed, o, b.data());
    EXPECT_EQ(a, b);
    EXPECT_EQ(ta.crop.top, tb.crop.top);
    EXPECT_EQ(ta.crop.width, tb.crop.width);
    EXPECT_EQ(ta.flipped, tb.flipped);
    flips += ta.flipped;
  }
  EXPECT_GT(flips, 2);
  EXPECT_LT(flips, 14);
  // The flip is drawn after the crop, so forcing it mirrors the same crop.
  o.flip_probability = 1.0;
  train_transform(jpg.data(), jpg.size(), 5, o, a.data());
  o.flip_probability = 0.0;
  train_transform(jpg.data(), jpg.size(), 5, o, b.data());
  for (int c = 0; c < 3; ++c)
    for (int y = 0; y < 224; ++y)
      for (int x = 0; x < 224; ++x) ASSERT_EQ(a[(c * 224 + y) * 224 + x], b[(c * 224 + y) * 224 + 223 - x]);
}

TEST(ImageTransforms, ValShapeAndCenterCropPosition) {
  // S x S images with R and G ramps: Resize(256) makes them 256x256 and the center crop starts at (16, 16),
  // so output (y, x) shows source pixel ((y + 16.5) * S / 256 - 0.5, likewise). 448 is decoded at full size,
  // 1024 at 1/4 (256 pixels exactly, then no resize at all).
  for (int size : {448, 1024}) {
    std::vector<uint8_t> p(static_cast<size_t>(size) * size * 3);
    const double step = 255.0 / (size - 1);
    for (int y = 0; y < size; ++y)
      for (int x = 0; x < size; ++x) {
        p[(static_cast<size_t>(y) * size + x) * 3 + 0] = static_cast<uint8_t>(std::lround(x * step));
        p[(static_cast<size_t>(y) * size + x) * 3 + 1] = static_cast<uint8_t>(std::lround(y * step));
        p[(static_cast<size_t>(y) * size + x) * 3 + 2] = 77;
      }
    const auto jpg = encode_jpeg(p, size, size, 3, JCS_RGB, 95);
    TransformOptions o;
    std::vector<float> out(3 * 224 * 224 + 16, 12345.0f);  // a canary after the image
    const TransformTrace t = val_transform(jpg.data(), jpg.size(), o, out.data());
    EXPECT_EQ(t.scale_eighths, size == 448 ? 8 : 2);
    EXPECT_EQ(t.crop.top, 16);
    EXPECT_EQ(t.crop.left, 16);
    for (size_t i = 3 * 224 * 224; i < out.size(); ++i) ASSERT_EQ(out[i], 12345.0f);
    out.resize(3 * 224 * 224);
    const auto hwc = denormalize(out, 224, o);
    const double f = size / 256.0;
    for (int y = 0; y < 224; y += 17) {
      for (int x = 0; x < 224; x += 13) {
        const double sx = (x + 16.5) * f - 0.5, sy = (y + 16.5) * f - 0.5;
        EXPECT_NEAR(hwc[(y * 224 + x) * 3 + 0], sx * step, 2.0) << size << ": " << y << "," << x;
        EXPECT_NEAR(hwc[(y * 224 + x) * 3 + 1], sy * step, 2.0) << size << ": " << y << "," << x;
        EXPECT_NEAR(hwc[(y * 224 + x) * 3 + 2], 77, 2.0);
      }
    }
  }
}

// Runs val_transform and train_transform(seed) and returns their uint8 results, the train one unflipped.
struct Outputs {
  std::vector<int> val, train;
  TransformTrace val_trace, train_trace;
};

Outputs run_transforms(const std::vector<uint8_t>& jpg, uint64_t seed, const TransformOptions& o) {
  Outputs r;
  std::vector<float> out(3 * 224 * 224);
  r.val_trace = val_transform(jpg.data(), jpg.size(), o, out.data());
  r.val = denormalize(out, 224, o);
  r.train_trace = train_transform(jpg.data(), jpg.size(), seed, o, out.data());
  r.train = denormalize(out, 224, o);
  if (r.train_trace.flipped) {
    for (int y = 0; y < 224; ++y)
      for (int x = 0; x < 112; ++x)
        for (int c = 0; c < 3; ++c) std::swap(r.train[(y * 224 + x) * 3 + c], r.train[(y * 224 + 223 - x) * 3 + c]);
  }
  return r;
}

// At full size cohort decodes with the same libjpeg and settings as PIL and reproduces Pillow's fixed-point
// resize, so the results are equal: tolerance 0. A 500x375 image is decoded at full size for both
// transforms (no power-of-two scale keeps 224 pixels of a crop, nor 256 of the short side).
TEST(ImageTransforms, EqualToTorchvisionAndPilAtFullSize) {
  const Outputs r = run_transforms(test_jpeg(), kTrainSeed, TransformOptions{});
  EXPECT_EQ(r.val_trace.scale_eighths, 8);
  EXPECT_EQ(r.train_trace.scale_eighths, 8);
  const CropBox& c = r.train_trace.crop;  // splitmix64 draws are the same on every build
  EXPECT_EQ(c.top, 25);
  EXPECT_EQ(c.left, 8);
  EXPECT_EQ(c.height, 329);
  EXPECT_EQ(c.width, 367);
  EXPECT_TRUE(r.train_trace.flipped);
  EXPECT_EQ(max_sample_diff(r.val, kPilVal), 0);
  EXPECT_EQ(max_sample_diff(r.train, kPilTrain), 0);
  EXPECT_NEAR(mean_of(r.val), kPilValMean, 1e-9);
  EXPECT_NEAR(mean_of(r.train), kPilTrainMean, 1e-9);
}

// A 1000x750 image is decoded at 1/2 scale. With DCT scaling off the results equal PIL's (checked on the
// samples and the mean), so that output stands for PIL's over all pixels. With it on, libjpeg's 4x4 IDCT
// does part of the shrinking the triangle filter does in PIL, and the train crop's edges fall on half
// pixels of the scaled image: both are low-pass filters of the same picture and differ by well under a
// grey level here. We allow a mean absolute difference of 2 levels over all pixels (the bound) and
// 1 level on the mean.
TEST(ImageTransforms, DctScaledCloseToTorchvisionAndPil) {
  TransformOptions full;
  full.dct_scaling = false;
  const Outputs pil = run_transforms(large_jpeg(), kLargeTrainSeed, full);
  EXPECT_EQ(pil.train_trace.crop.top, 68);
  EXPECT_EQ(pil.train_trace.crop.left, 363);
  EXPECT_EQ(pil.train_trace.crop.height, 515);
  EXPECT_EQ(pil.train_trace.crop.width, 556);
  EXPECT_EQ(max_sample_diff(pil.val, kPilLargeVal), 0);
  EXPECT_EQ(max_sample_diff(pil.train, kPilLargeTrain), 0);
  EXPECT_NEAR(mean_of(pil.val), kPilLargeValMean, 1e-9);
  EXPECT_NEAR(mean_of(pil.train), kPilLargeTrainMean, 1e-9);

  const Outputs scaled = run_transforms(large_jpeg(), kLargeTrainSeed, TransformOptions{});
  EXPECT_EQ(scaled.val_trace.scale_eighths, 4);
  EXPECT_EQ(scaled.train_trace.scale_eighths, 4);
  EXPECT_EQ(scaled.train_trace.crop.left, 363);
  EXPECT_NEAR(mean_of(scaled.val), kPilLargeValMean, 1.0);
  EXPECT_NEAR(mean_of(scaled.train), kPilLargeTrainMean, 1.0);
  const std::pair<const std::vector<int>*, const std::vector<int>*> pairs[] = {{&pil.val, &scaled.val},
                                                                               {&pil.train, &scaled.train}};
  for (const auto& [a, b] : pairs) {
    double diff = 0;
    for (size_t i = 0; i < a->size(); ++i) diff += std::abs((*a)[i] - (*b)[i]);
    diff /= a->size();
    EXPECT_LT(diff, 2.0);
    std::printf("DCT-scaled vs PIL: mean absolute difference %.3f levels\n", diff);
  }
}

}  // namespace cohort::data

// Test images written as real JPEG files with libjpeg, for the image-folder tests: no binary fixtures in
// the repository, and every pixel known to the test.
//
//   auto bytes = cohort::testing::encode_jpeg(rgb, 500, 375);     // RGB, quality 90
//   cohort::testing::write_jpeg("/tmp/x/cat/0.jpg", 500, 375, /*seed=*/7);
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <jpeglib.h>

namespace cohort::testing {

// Pixels (components * width * height, row-major, interleaved) to a JPEG, baseline or progressive.
inline std::vector<uint8_t> encode_jpeg(const std::vector<uint8_t>& pixels, int width, int height, int components = 3,
                                        J_COLOR_SPACE space = JCS_RGB, int quality = 90, bool progressive = false) {
  jpeg_compress_struct c{};
  jpeg_error_mgr err{};
  c.err = jpeg_std_error(&err);
  jpeg_create_compress(&c);
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&c, &buf, &size);
  c.image_width = static_cast<JDIMENSION>(width);
  c.image_height = static_cast<JDIMENSION>(height);
  c.input_components = components;
  c.in_color_space = space;
  jpeg_set_defaults(&c);
  jpeg_set_quality(&c, quality, TRUE);
  if (progressive) jpeg_simple_progression(&c);
  jpeg_start_compress(&c, TRUE);
  while (c.next_scanline < c.image_height) {
    JSAMPROW row = const_cast<JSAMPROW>(pixels.data() + static_cast<size_t>(c.next_scanline) * width * components);
    jpeg_write_scanlines(&c, &row, 1);
  }
  jpeg_finish_compress(&c);
  std::vector<uint8_t> out(buf, buf + size);
  std::free(buf);
  jpeg_destroy_compress(&c);
  return out;
}

// A smooth pattern that differs with `seed`: gradients per channel plus a seed-dependent offset.
inline std::vector<uint8_t> pattern(int width, int height, int seed) {
  std::vector<uint8_t> rgb(static_cast<size_t>(3) * width * height);
  for (int y = 0; y < height; ++y)
    for (int x = 0; x < width; ++x) {
      uint8_t* p = rgb.data() + (static_cast<size_t>(y) * width + x) * 3;
      p[0] = static_cast<uint8_t>((x * 255 / std::max(1, width - 1) + seed * 37) % 256);
      p[1] = static_cast<uint8_t>((y * 255 / std::max(1, height - 1) + seed * 11) % 256);
      p[2] = static_cast<uint8_t>(((x + y) / 2 + seed * 5) % 256);
    }
  return rgb;
}

inline void write_file(const std::filesystem::path& p, const std::string& bytes) {
  std::filesystem::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << bytes;
}

inline void write_jpeg(const std::filesystem::path& p, int width, int height, int seed) {
  const auto bytes = encode_jpeg(pattern(width, height, seed), width, height);
  write_file(p, std::string(bytes.begin(), bytes.end()));
}

}  // namespace cohort::testing

// Each model's preprocessing preset (data/Presets.h), and PIL's BICUBIC filter that timm's preset needs.
// Bit-exactness against timm and torchvision on real JPEGs is tests/reference/models.py.
#include <gtest/gtest.h>

#include <vector>

#include "cohort/data/Presets.h"

using namespace cohort::data;

TEST(Presets, EachModelGetsItsReferenceWeightsTransform) {
  const auto vit = model_transform("vit_b32", 224);
  EXPECT_EQ(vit.resize_size, 248);  // timm: floor(224 / crop_pct 0.9)
  EXPECT_EQ(vit.crop_size, 224);
  EXPECT_EQ(vit.interpolation, Interpolation::bicubic);
  EXPECT_FLOAT_EQ(vit.mean[0], 0.5f);
  EXPECT_FLOAT_EQ(vit.std[2], 0.5f);
  const auto r50 = model_transform("resnet50", 224);
  EXPECT_EQ(r50.resize_size, 232);  // torchvision IMAGENET1K_V2
  EXPECT_EQ(r50.interpolation, Interpolation::bilinear);
  EXPECT_FLOAT_EQ(r50.mean[0], 0.485f);
  EXPECT_EQ(model_transform("resnet18", 224).resize_size, 256);
  EXPECT_EQ(model_transform("resnet8", 112).resize_size, 128);  // 256/224 of the crop
}

TEST(PilResize, BicubicOvershootsAnEdgeWhereBilinearCannot) {
  // A step edge 0 -> 200 halved in width: the triangle filter stays within [0, 200], Keys' cubic (a = -0.5)
  // rings past it on both sides (clipped to 0 below), as PIL's BICUBIC does.
  const int w = 16, h = 2;
  std::vector<uint8_t> src(static_cast<size_t>(w) * h * 3 + 1);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c) src[(static_cast<size_t>(y) * w + x) * 3 + c] = x < w / 2 ? 0 : 200;
  auto run = [&](Interpolation f) {
    PilResize r;
    r.plan(w, h, ResizeBox{0, 0, double(w), double(h)}, w / 2, h, CropBox{}, f);
    std::vector<uint8_t> out(static_cast<size_t>(r.out_width()) * r.out_height() * 3 + 1);
    r.run(src.data(), static_cast<size_t>(w) * 3, out.data());
    return out;
  };
  const auto lin = run(Interpolation::bilinear), cub = run(Interpolation::bicubic);
  int lin_max = 0, cub_max = 0;
  for (int x = 0; x < w / 2; ++x) {
    lin_max = std::max<int>(lin_max, lin[x * 3]);
    cub_max = std::max<int>(cub_max, cub[x * 3]);
  }
  EXPECT_EQ(lin_max, 200);
  EXPECT_GT(cub_max, 200);  // the cubic's overshoot
  EXPECT_EQ(cub[0], 0);
}

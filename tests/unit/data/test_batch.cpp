// make_batch: exact normalization, augmentation that is a pure function of (seed, epoch, sample index),
// and outputs checked against a reference crop-and-flip built from tensor ops on a known pattern.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cstdint>
#include <set>
#include <tuple>
#include <vector>

#include "cohort/data/Batch.h"
#include "cohort/data/FashionMnist.h"

using cohort::data::augment_params;
using cohort::data::AugmentOptions;
using cohort::data::AugmentParams;
using cohort::data::Batch;
using cohort::data::ImageDataset;
using cohort::data::make_batch;

namespace {

constexpr int64_t kN = 40, kC = 2, kH = 6, kW = 7;

// Every pixel of every sample distinct from its neighbours and never 0, so padding and each
// crop/flip are told apart by value.
ImageDataset pattern_dataset() {
  ImageDataset ds;
  ds.images = at::empty({kN, kC, kH, kW}, at::kByte);
  uint8_t* p = ds.images.data_ptr<uint8_t>();
  for (int64_t i = 0; i < ds.images.numel(); ++i) p[i] = static_cast<uint8_t>(1 + (i * 37) % 254);
  ds.labels = at::arange(kN, at::kLong).remainder(10);
  ds.num_classes = 10;
  ds.name = "pattern";
  ds.mean = cohort::data::kFashionMnistMean;
  ds.std = cohort::data::kFashionMnistStd;
  return ds;
}

float normalized(uint8_t v, const ImageDataset& ds) { return (static_cast<float>(v) / 255.0f - ds.mean) / ds.std; }

// The reference transform from tensor ops: zero-pad, crop, then flip, all on uint8 (exact), then
// normalized pixel by pixel with the scalar formula.
at::Tensor reference(const ImageDataset& ds, int64_t index, int64_t pad, int64_t dx, int64_t dy, bool flip) {
  at::Tensor img = ds.images[index];  // [C, H, W]
  at::Tensor padded = at::constant_pad_nd(img, {pad, pad, pad, pad}, 0);
  at::Tensor crop = padded.narrow(1, pad + dy, kH).narrow(2, pad + dx, kW);
  if (flip) crop = crop.flip({2});
  crop = crop.contiguous();
  at::Tensor out = at::empty({kC, kH, kW}, at::kFloat);
  const uint8_t* s = crop.data_ptr<uint8_t>();
  float* d = out.data_ptr<float>();
  for (int64_t i = 0; i < out.numel(); ++i) d[i] = normalized(s[i], ds);
  return out;
}

std::vector<int64_t> iota_indices(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = i;
  return v;
}

}  // namespace

TEST(MakeBatch, NormalizationIsExact) {
  ImageDataset ds = pattern_dataset();
  ds.images[3][1][2][4] = 0;
  ds.images[3][1][2][5] = 255;
  ds.images[3][1][2][6] = 128;
  const Batch b = make_batch(ds, {3});
  ASSERT_EQ(b.images.sizes(), (at::IntArrayRef{1, kC, kH, kW}));
  ASSERT_EQ(b.images.scalar_type(), at::kFloat);
  EXPECT_EQ(b.images[0][1][2][4].item<float>(), (0.0f - 0.2860f) / 0.3530f);
  EXPECT_EQ(b.images[0][1][2][5].item<float>(), (1.0f - 0.2860f) / 0.3530f);
  EXPECT_EQ(b.images[0][1][2][6].item<float>(), (128.0f / 255.0f - 0.2860f) / 0.3530f);
  EXPECT_NEAR(b.images[0][1][2][4].item<float>(), -0.8101983, 1e-6);
  EXPECT_NEAR(b.images[0][1][2][5].item<float>(), 2.0226629, 1e-6);
  // Every pixel without augmentation: just the formula.
  EXPECT_TRUE(at::equal(b.images[0], reference(ds, 3, 0, 0, 0, false)));
  EXPECT_EQ(b.labels.scalar_type(), at::kLong);
  EXPECT_EQ(b.labels[0].item<int64_t>(), 3);
}

TEST(MakeBatch, GathersInTheGivenOrder) {
  const ImageDataset ds = pattern_dataset();
  const std::vector<int64_t> idx = {7, 2, 7, 39};
  const Batch b = make_batch(ds, idx);
  for (size_t k = 0; k < idx.size(); ++k) {
    EXPECT_TRUE(at::equal(b.images[static_cast<int64_t>(k)], reference(ds, idx[k], 0, 0, 0, false)));
    EXPECT_EQ(b.labels[static_cast<int64_t>(k)].item<int64_t>(), idx[k] % 10);
  }
  const Batch empty = make_batch(ds, std::vector<int64_t>{});
  EXPECT_EQ(empty.images.sizes(), (at::IntArrayRef{0, kC, kH, kW}));
}

TEST(MakeBatch, AugmentationIsAValidCropAndFlip) {
  const ImageDataset ds = pattern_dataset();
  AugmentOptions opt;
  opt.enabled = true;
  opt.crop_padding = 2;
  opt.seed = 99;
  opt.epoch = 4;
  const Batch b = make_batch(ds, iota_indices(kN), opt);
  std::set<std::tuple<int64_t, int64_t, bool>> used;
  for (int64_t i = 0; i < kN; ++i) {
    // The output is one of the 5 x 5 x 2 valid transforms...
    int matches = 0;
    std::tuple<int64_t, int64_t, bool> which;
    for (int64_t dy = -2; dy <= 2; ++dy) {
      for (int64_t dx = -2; dx <= 2; ++dx) {
        for (bool flip : {false, true}) {
          if (at::equal(b.images[i], reference(ds, i, 2, dx, dy, flip))) {
            ++matches;
            which = {dx, dy, flip};
          }
        }
      }
    }
    ASSERT_EQ(matches, 1) << "sample " << i;
    // ...namely the one augment_params documents.
    const AugmentParams p = augment_params(opt, i);
    EXPECT_EQ(which, std::make_tuple(p.dx, p.dy, p.flip)) << "sample " << i;
    used.insert(which);
  }
  // 40 samples spread over many transforms, both flips included.
  EXPECT_GT(used.size(), 15u);
  std::set<bool> flips;
  std::set<int64_t> dxs, dys;
  for (const auto& [dx, dy, flip] : used) {
    flips.insert(flip);
    dxs.insert(dx);
    dys.insert(dy);
  }
  EXPECT_EQ(flips.size(), 2u);
  EXPECT_EQ(dxs.size(), 5u);
  EXPECT_EQ(dys.size(), 5u);
}

TEST(MakeBatch, PaddingNormalizesFromZeroIntensity) {
  const ImageDataset ds = pattern_dataset();
  AugmentOptions opt;
  opt.enabled = true;
  opt.crop_padding = 3;
  // Find a sample shifted down by a full 3 rows (dy = -3 reads rows -3..-1 first): its top rows are padding.
  for (int64_t i = 0; i < kN; ++i) {
    const AugmentParams p = augment_params(opt, i);
    if (p.dy != -3) continue;
    const Batch b = make_batch(ds, {i}, opt);
    const float zero = normalized(0, ds);
    for (int64_t ch = 0; ch < kC; ++ch) {
      for (int64_t y = 0; y < 3; ++y) {
        for (int64_t x = 0; x < kW; ++x) ASSERT_EQ(b.images[0][ch][y][x].item<float>(), zero);
      }
    }
    EXPECT_TRUE(at::equal(b.images[0], reference(ds, i, 3, p.dx, p.dy, p.flip)));
    return;
  }
  FAIL() << "no sample drew dy = -3 among " << kN;
}

TEST(MakeBatch, SameSampleSameAugmentationWhateverTheBatch) {
  const ImageDataset ds = pattern_dataset();
  AugmentOptions opt;
  opt.enabled = true;
  opt.seed = 5;
  opt.epoch = 1;
  const Batch whole = make_batch(ds, iota_indices(kN), opt);
  // Alone, in a different batch, at a different position, or sliced by pointer and count.
  for (int64_t i : {0, 13, 39}) {
    EXPECT_TRUE(at::equal(make_batch(ds, {i}, opt).images[0], whole.images[i])) << i;
    const Batch mixed = make_batch(ds, {38, i, 1}, opt);
    EXPECT_TRUE(at::equal(mixed.images[1], whole.images[i])) << i;
    EXPECT_EQ(mixed.labels[1].item<int64_t>(), whole.labels[i].item<int64_t>());
  }
  const std::vector<int64_t> all = iota_indices(kN);
  const Batch slice = make_batch(ds, all.data() + 10, 5, opt);
  EXPECT_TRUE(at::equal(slice.images, whole.images.narrow(0, 10, 5)));
  // Deterministic for the same (seed, epoch); different for another epoch or seed.
  EXPECT_TRUE(at::equal(make_batch(ds, all, opt).images, whole.images));
  AugmentOptions next = opt;
  next.epoch = 2;
  EXPECT_FALSE(at::equal(make_batch(ds, all, next).images, whole.images));
  AugmentOptions other = opt;
  other.seed = 6;
  EXPECT_FALSE(at::equal(make_batch(ds, all, other).images, whole.images));
}

TEST(MakeBatch, NoPaddingNoFlipIsPlainNormalization) {
  const ImageDataset ds = pattern_dataset();
  AugmentOptions opt;
  opt.enabled = true;
  opt.crop_padding = 0;
  opt.hflip = false;
  opt.seed = 17;
  EXPECT_TRUE(at::equal(make_batch(ds, iota_indices(kN), opt).images, make_batch(ds, iota_indices(kN)).images));
}

TEST(MakeBatch, FlipOnlyMirrorsAboutHalfTheSamples) {
  const ImageDataset ds = pattern_dataset();
  AugmentOptions opt;
  opt.enabled = true;
  opt.crop_padding = 0;
  opt.hflip = true;
  opt.seed = 17;
  const Batch b = make_batch(ds, iota_indices(kN), opt);
  int flipped = 0;
  for (int64_t i = 0; i < kN; ++i) {
    const bool same = at::equal(b.images[i], reference(ds, i, 0, 0, 0, false));
    const bool mirrored = at::equal(b.images[i], reference(ds, i, 0, 0, 0, true));
    ASSERT_NE(same, mirrored) << "sample " << i << " is neither the image nor its mirror";
    flipped += mirrored;
    EXPECT_EQ(mirrored, augment_params(opt, i).flip);
  }
  EXPECT_GT(flipped, 8);
  EXPECT_LT(flipped, 32);
  // Turning flips off leaves the crop draws unchanged.
  AugmentOptions crop_only = opt;
  crop_only.crop_padding = 2;
  AugmentOptions crop_flip = crop_only;
  crop_only.hflip = false;
  for (int64_t i = 0; i < kN; ++i) {
    EXPECT_EQ(augment_params(crop_only, i).dx, augment_params(crop_flip, i).dx);
    EXPECT_EQ(augment_params(crop_only, i).dy, augment_params(crop_flip, i).dy);
    EXPECT_FALSE(augment_params(crop_only, i).flip);
  }
}

TEST(MakeBatch, DisabledAugmentationIgnoresItsOptions) {
  const ImageDataset ds = pattern_dataset();
  AugmentOptions opt;
  opt.enabled = false;
  opt.seed = 3;
  opt.crop_padding = 4;
  const AugmentParams p = augment_params(opt, 11);
  EXPECT_EQ(p.dx, 0);
  EXPECT_EQ(p.dy, 0);
  EXPECT_FALSE(p.flip);
  EXPECT_TRUE(at::equal(make_batch(ds, iota_indices(kN), opt).images, make_batch(ds, iota_indices(kN)).images));
}

// airbench's alternating flip: each sample flips in exactly one of any two consecutive epochs, about half of
// the samples in each epoch, and crops are drawn as without it.
TEST(AugmentParams, AlternatingFlipInvertsEveryEpoch) {
  cohort::data::AugmentOptions a{true, 2, true, /*seed=*/9, /*epoch=*/0, /*alternating_flip=*/true};
  int flipped = 0;
  for (int64_t i = 0; i < 1000; ++i) {
    a.epoch = 4;
    const auto even = cohort::data::augment_params(a, i);
    a.epoch = 5;
    const auto odd = cohort::data::augment_params(a, i);
    EXPECT_NE(even.flip, odd.flip) << i;
    flipped += even.flip;
    a.alternating_flip = false;
    const auto plain = cohort::data::augment_params(a, i);
    EXPECT_EQ(plain.dx, odd.dx);
    EXPECT_EQ(plain.dy, odd.dy);
    a.alternating_flip = true;
  }
  EXPECT_GT(flipped, 430);
  EXPECT_LT(flipped, 570);
}

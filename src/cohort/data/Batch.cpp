#include "cohort/data/Batch.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <array>
#include <string>
#include <vector>

#include "cohort/util/Error.h"
#include "cohort/util/Rng.h"

namespace cohort::data {

std::array<float, 256> normalize_table(float mean, float std) {
  std::array<float, 256> table{};
  for (int v = 0; v < 256; ++v) table[v] = (static_cast<float>(v) / 255.0f - mean) / std;
  return table;
}

std::vector<std::array<float, 256>> normalize_tables(const ImageDataset& dataset) {
  std::vector<std::array<float, 256>> tables(dataset.images.size(1));
  for (size_t ch = 0; ch < tables.size(); ++ch) {
    const auto c = static_cast<int64_t>(ch);
    tables[ch] = normalize_table(dataset.mean_of(c), dataset.std_of(c));
  }
  return tables;
}

void check_augment(const AugmentOptions& options) {
  if (options.enabled && options.crop_padding < 0)
    throw ConfigError("data.crop_padding must be >= 0, got " + std::to_string(options.crop_padding),
                      "pass data.crop_padding=2, or 0 for no random crop");
}

AugmentParams augment_params(const AugmentOptions& options, int64_t sample_index) {
  AugmentParams p;
  if (!options.enabled) return p;
  util::Rng rng(
      util::mix_seed(options.seed, static_cast<uint64_t>(options.epoch), static_cast<uint64_t>(sample_index)));
  const bool flip = (rng.next_u64() & 1) != 0;
  const auto span = static_cast<uint64_t>(2 * options.crop_padding + 1);
  const int64_t dx = static_cast<int64_t>(rng.uniform_int(span)) - options.crop_padding;
  const int64_t dy = static_cast<int64_t>(rng.uniform_int(span)) - options.crop_padding;
  p.flip = options.hflip && flip;
  if (options.hflip && options.alternating_flip) {
    // airbench's alternating flip: a sample's flip is a coin toss of its own, fixed for the run, inverted
    // every odd epoch, so each image is seen both ways within any two epochs.
    const bool own =
        (util::Rng(util::mix_seed(options.seed, 0xF1195EEDull, static_cast<uint64_t>(sample_index))).next_u64() & 1) !=
        0;
    p.flip = own != ((options.epoch & 1) != 0);
  }
  p.dx = dx;
  p.dy = dy;
  return p;
}

Batch make_batch(const ImageDataset& dataset, const int64_t* indices, int64_t count, const AugmentOptions& options) {
  check_augment(options);
  const at::Tensor& images = dataset.images;
  const at::Tensor& labels = dataset.labels;
  COHORT_ASSERT(images.defined() && images.dim() == 4 && images.scalar_type() == at::kByte && images.is_contiguous() &&
                    images.device().is_cpu(),
                "make_batch: dataset images must be a contiguous CPU uint8 [N, C, H, W] tensor");
  COHORT_ASSERT(labels.defined() && labels.dim() == 1 && labels.scalar_type() == at::kLong && labels.is_contiguous() &&
                    labels.size(0) == images.size(0),
                "make_batch: dataset labels must be a contiguous int64 [N] tensor matching the images");
  COHORT_ASSERT(count >= 0 && (count == 0 || indices != nullptr), "make_batch: bad index range");

  const int64_t n = images.size(0), c = images.size(1), h = images.size(2), w = images.size(3);
  const int64_t plane = h * w;
  Batch batch;
  batch.images = at::empty({count, c, h, w}, at::TensorOptions().dtype(at::kFloat));
  batch.labels = at::empty({count}, at::TensorOptions().dtype(at::kLong));

  const auto tables = normalize_tables(dataset);
  const uint8_t* src = images.data_ptr<uint8_t>();
  const int64_t* src_labels = labels.data_ptr<int64_t>();
  float* dst = batch.images.data_ptr<float>();
  int64_t* dst_labels = batch.labels.data_ptr<int64_t>();

  // A raw loop over bytes rather than per-sample tensor ops: a batch of 128 Fashion-MNIST images is
  // 100 K pixels, far too little work to pay for the dispatch of a dozen small tensor operations.
  for (int64_t b = 0; b < count; ++b) {
    const int64_t index = indices[b];
    COHORT_ASSERT(index >= 0 && index < n,
                  "make_batch: sample index " + std::to_string(index) + " outside [0, " + std::to_string(n) + ")");
    dst_labels[b] = src_labels[index];
    const AugmentParams p = augment_params(options, index);
    for (int64_t ch = 0; ch < c; ++ch) {
      const std::array<float, 256>& table = tables[ch];
      // Padding is zero intensity before normalization, so it becomes (0 - mean) / std afterwards.
      const float fill = table[0];
      const uint8_t* in = src + (index * c + ch) * plane;
      float* out = dst + (b * c + ch) * plane;
      for (int64_t y = 0; y < h; ++y) {
        float* row = out + y * w;
        const int64_t sy = y + p.dy;
        if (sy < 0 || sy >= h) {
          std::fill(row, row + w, fill);
          continue;
        }
        const uint8_t* in_row = in + sy * w;
        if (!p.flip && p.dx == 0) {
          for (int64_t x = 0; x < w; ++x) row[x] = table[in_row[x]];
          continue;
        }
        for (int64_t x = 0; x < w; ++x) {
          const int64_t sx = (p.flip ? w - 1 - x : x) + p.dx;
          row[x] = (sx >= 0 && sx < w) ? table[in_row[sx]] : fill;
        }
      }
    }
  }
  return batch;
}

Batch make_batch(const ImageDataset& dataset, const std::vector<int64_t>& indices, const AugmentOptions& options) {
  return make_batch(dataset, indices.data(), static_cast<int64_t>(indices.size()), options);
}

}  // namespace cohort::data

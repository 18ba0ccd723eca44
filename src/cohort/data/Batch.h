// Turns a list of sample indices into a normalized float batch, with optional augmentation (random crop
// with zero padding, then a random horizontal flip). A sample's augmentation is a pure function of
// (seed, epoch, sample index), so it is the same whatever the world size or the batch it lands in; this
// is what lets a run on 4 ranks reproduce a single-process run that sees the whole global batch.
//
//   cohort::data::AugmentOptions aug{/*enabled=*/true, /*crop_padding=*/2, /*hflip=*/true, seed, epoch};
//   std::vector<int64_t> mine = sampler.indices(epoch);
//   cohort::data::Batch b = cohort::data::make_batch(train, mine.data() + step * bs, bs, aug);
//   // b.images: float32 [bs, 1, 28, 28]; b.labels: int64 [bs]
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <vector>

#include "cohort/data/FashionMnist.h"

namespace cohort::data {

struct Batch {
  at::Tensor images;  // float32 [B, C, H, W], normalized with the dataset's mean and std (torch::Tensor)
  at::Tensor labels;  // int64 [B]

  int64_t size() const { return labels.defined() ? labels.size(0) : 0; }
};

struct AugmentOptions {
  bool enabled = false;
  // The crop offsets dx, dy are uniform in [-crop_padding, crop_padding]; pixels shifted in from outside
  // the image are 0 intensity before normalization, as with torchvision's RandomCrop(padding=p).
  int64_t crop_padding = 2;
  bool hflip = true;  // flip left-right with probability 0.5
  uint64_t seed = 0;
  int64_t epoch = 0;
  bool alternating_flip = false;  // airbench's: a fixed random half flipped in even epochs, the other half in odd
};

// The transform one sample receives. out[c][y][x] = in[c][y + dy][x' + dx] with x' = W-1-x when flip
// and x otherwise (crop first, then flip), and 0 intensity where that falls outside the image.
struct AugmentParams {
  int64_t dx = 0;
  int64_t dy = 0;
  bool flip = false;
};

// The draws for one sample, from cohort::util::Rng(cohort::util::mix_seed(seed, epoch, sample_index)) in the order
// flip, dx, dy. All three are drawn even when hflip is off or the padding is 0, so turning one
// augmentation off does not change the other. Identity when augmentation is disabled.
AugmentParams augment_params(const AugmentOptions& options, int64_t sample_index);

// Every uint8 value normalizes to one float, so a 256-entry table replaces the per-pixel arithmetic and
// makes the result bit-for-bit the scalar formula (x / 255 - mean) / std evaluated in float, on any
// device (a GPU divides by a scalar as a multiplication by its reciprocal, which rounds differently).
std::array<float, 256> normalize_table(float mean, float std);
// One table per channel of the dataset, from its mean and std.
std::vector<std::array<float, 256>> normalize_tables(const ImageDataset& dataset);

// Throws ConfigError, naming the key, for options no batch can be made with (a negative crop padding).
void check_augment(const AugmentOptions& options);

// Gathers dataset samples indices[0..count) into a batch. Indices must lie in [0, dataset.size()).
Batch make_batch(const ImageDataset& dataset, const int64_t* indices, int64_t count,
                 const AugmentOptions& options = {});
Batch make_batch(const ImageDataset& dataset, const std::vector<int64_t>& indices, const AugmentOptions& options = {});

}  // namespace cohort::data

// An in-memory dataset kept whole on the training device (data.device_resident=true): the uint8 images
// go to the GPU once, and each batch is gathered, augmented (crop with zero padding, flip) and
// normalized there, so a step needs no host-to-device copy of pixels. For datasets that fit in device
// memory, as airbench keeps CIFAR-10 on the GPU: 50,000 CIFAR-10 images are 150 MB as uint8.
//
// The batches are exactly make_batch()'s (and in_memory()'s, with the same bilinear resize): the same
// per-sample draws (augment_params on the host, a few bytes per sample), the same float arithmetic,
// so a run gives the same numbers with the option on or off.
//
//   auto src = cohort::data::device_resident(cohort::data::load_cifar10(root, true), at::Device("cuda:0"));
//   auto b = src->batch(indices, aug);   // b.images: float32 on cuda:0
#pragma once

#include <memory>

#include <c10/core/Device.h>

#include "cohort/data/Source.h"

namespace cohort::data {

std::unique_ptr<Source> device_resident(ImageDataset dataset, c10::Device device, int64_t image_size = 0);

}  // namespace cohort::data

// An in-memory dataset kept whole on the training device (data.device_resident=true): the uint8 images
// go to the GPU once, and each batch is gathered, augmented (crop with zero padding, flip) and
// normalized there, so a step copies no pixels to the device, only 32 bytes per sample of indices and
// draws. For datasets that fit in device memory, as airbench keeps CIFAR-10 on the GPU: 50,000
// CIFAR-10 images are 150 MB as uint8.
//
// The batches are exactly make_batch()'s: the same per-sample draws (augment_params, on the host),
// gathers that copy bytes, and make_batch's normalization table. With a resize (data.image_size) the
// bilinear interpolation runs on the device too; on a GPU its kernel may round differently from the
// CPU's in the last bit, so that case is the host path's up to float rounding.
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

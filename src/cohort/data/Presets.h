// The image preprocessing that belongs to a model: the evaluation transform of the reference weights a
// cohort model is named after, so that weights from timm or torchvision give their own predictions in
// cohort, and a model cohort trains on JPEG folders is evaluated (and used by `cohort predict`) the same way.
//
//   auto t = cohort::data::model_transform("vit_b32", 224);   // timm: Resize(248, bicubic), CenterCrop(224),
//                                                             // mean = std = 0.5
//   cohort::data::val_transform(bytes, n, t, out);
//
// The presets, for an image_size S (the crop):
//   vit_b32   timm's vit_base_patch32_224 data config: crop_pct 0.9, so Resize(floor(S / 0.9)), BICUBIC,
//             mean (0.5, 0.5, 0.5), std (0.5, 0.5, 0.5)
//   resnet50  torchvision's ResNet50_Weights.DEFAULT (IMAGENET1K_V2): Resize(S * 232 / 224), BILINEAR,
//             ImageNet mean and std
//   others    torchvision's classic ImageNet preset (resnet18/34's IMAGENET1K_V1): Resize(S * 256 / 224),
//             BILINEAR, ImageNet mean and std
#pragma once

#include <string>

#include "cohort/data/ImageTransforms.h"

namespace cohort::data {

// The transform options (crop, resize, filter, mean, std) of `model` at crop size `image_size`; the
// random-crop settings stay torchvision's RandomResizedCrop defaults.
TransformOptions model_transform(const std::string& model, int image_size);

// Where the preset comes from, for logs and errors: "timm vit_base_patch32_224", ...
std::string model_transform_source(const std::string& model);

}  // namespace cohort::data

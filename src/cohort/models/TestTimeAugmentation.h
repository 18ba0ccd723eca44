// Test-time augmentation as airbench evaluates: logits averaged over mirrored and 1-pixel-translated views
// of each image. It only runs the model forward (no gradients, no change of train/eval mode: put the model
// in eval mode first, or BatchNorm will use and update batch statistics).
//
//   net->eval();
//   at::Tensor logits = cohort::models::tta_logits(*net, images, /*level=*/2);   // [B, num_classes]
#pragma once

#include <ATen/ATen.h>

#include "cohort/models/Models.h"

namespace cohort::models {

// The weighted mean of the model's logits over these views of `images` [B, C, H, W] (H, W >= 2):
//   level 0: the images (1 forward).
//   level 1: the images and their left-right mirror, 1/2 each (2 forwards).
//   level 2: 1/2 on level 1 of the images, and 1/4 on level 1 of each of two translations: pad by 1 pixel
//            with reflection and crop the H x W window at the top-left or at the bottom-right corner, i.e. the
//            content moves one pixel down-right or up-left. Per view: 1/4 on the image and its mirror, 1/8
//            on each of the four translated views (6 forwards). These are airbench94's weights.
// Each view is one forward of the whole batch, so the memory of a call is that of a plain forward.
// Throws ConfigError for another level or images that are not 4-D.
at::Tensor tta_logits(Classifier& model, const at::Tensor& images, int level);

}  // namespace cohort::models

// Vision Transformers with timm's architecture and state_dict names (cls_token, pos_embed,
// patch_embed.proj.weight, blocks.N.attn.qkv.weight, ..., head.bias), so a timm `vit_base_patch32_224`
// checkpoint exported to safetensors loads by name. `make_vit_b32` is that model; `make_vit` builds any size,
// which is what the tests use to get a tiny transformer quickly.
//
//   auto net = cohort::models::make_vit_b32(/*in_channels=*/3, /*image_size=*/224, /*num_classes=*/1000);
//   at::Tensor logits = net->forward(images);   // images [B, 3, 224, 224] -> logits [B, 1000]
//
//   cohort::models::VitOptions tiny;
//   tiny.image_size = 64; tiny.dim = 64; tiny.depth = 2; tiny.heads = 4; tiny.num_classes = 10;
//   auto small = cohort::models::make_vit(tiny);
#pragma once

#include <cstdint>
#include <memory>

#include "cohort/models/Models.h"

namespace cohort::models {

// The defaults are ViT-B/32 at 224 pixels (88,224,232 parameters with 1000 classes).
struct VitOptions {
  int64_t image_size = 224;  // square input images, image_size x image_size; a multiple of `patch`
  int64_t patch = 32;        // square, non-overlapping patches; (image_size / patch)^2 tokens plus the class token
  int64_t dim = 768;         // token width
  int64_t depth = 12;        // transformer blocks
  int64_t heads = 12;        // attention heads; dim must be a multiple of heads
  int64_t mlp_ratio = 4;     // hidden width of each block's MLP is dim * mlp_ratio
  int64_t in_channels = 3;
  int64_t num_classes = 1000;
};

// A pre-norm ViT as in timm (~0.9): patch embedding, class token prepended, learned position embedding,
// `depth` blocks (x += attn(norm1(x)); x += mlp(norm2(x))), final LayerNorm, head on the class token.
// No dropout or drop-path. Throws cohort::ConfigError for options that cannot build a model, e.g. an
// image size that is not a multiple of the patch size.
std::shared_ptr<Classifier> make_vit(const VitOptions& options);

// timm's vit_base_patch32_224 for the given input channels, image size (a multiple of 32) and classes.
std::shared_ptr<Classifier> make_vit_b32(int64_t in_channels, int64_t image_size, int64_t num_classes);

}  // namespace cohort::models

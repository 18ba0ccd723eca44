#include "cohort/data/Presets.h"

#include <cmath>

namespace cohort::data {

TransformOptions model_transform(const std::string& model, int image_size) {
  TransformOptions t;
  t.crop_size = image_size;
  if (model == "vit_b32") {
    // timm: scale_size = math.floor(img_size / crop_pct).
    t.resize_size = static_cast<int>(std::floor(image_size / 0.9));
    t.interpolation = Interpolation::bicubic;
    t.mean = {0.5f, 0.5f, 0.5f};
    t.std = {0.5f, 0.5f, 0.5f};
  } else if (model == "resnet50") {
    t.resize_size = image_size * 232 / 224;
  } else {
    t.resize_size = image_size * 256 / 224;
  }
  return t;
}

std::string model_transform_source(const std::string& model) {
  if (model == "vit_b32") return "timm vit_base_patch32_224 (bicubic, crop_pct 0.9, mean/std 0.5)";
  if (model == "resnet50") return "torchvision ResNet50_Weights.IMAGENET1K_V2 (resize 232, bilinear)";
  return "torchvision ImageNet preset (resize 256, bilinear)";
}

}  // namespace cohort::data

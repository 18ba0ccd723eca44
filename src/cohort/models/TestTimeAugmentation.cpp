#include "cohort/models/TestTimeAugmentation.h"

#include <torch/torch.h>

#include <string>

#include "cohort/util/Error.h"

namespace cohort::models {
namespace {

// The image and its left-right mirror (flip of the last, width, dimension), equally weighted.
at::Tensor mirror_logits(Classifier& model, const at::Tensor& images) {
  return 0.5 * model.forward(images) + 0.5 * model.forward(images.flip({-1}));
}

}  // namespace

at::Tensor tta_logits(Classifier& model, const at::Tensor& images, int level) {
  if (level < 0 || level > 2)
    throw ConfigError("test-time augmentation level must be 0, 1 or 2, got " + std::to_string(level),
                      "0 = plain, 1 = + mirror, 2 = + mirror and 1-pixel translations (airbench94 uses 2)");
  if (!images.defined() || images.dim() != 4 || images.size(2) < 2 || images.size(3) < 2)
    throw ConfigError("test-time augmentation needs images [B, C, H, W] with H, W >= 2, got " +
                          std::to_string(images.defined() ? images.dim() : 0) + "-D input",
                      "pass a batch of images, not a single image");
  torch::NoGradGuard no_grad;
  if (level == 0) return model.forward(images);
  const at::Tensor plain = mirror_logits(model, images);
  if (level == 1) return plain;
  const int64_t height = images.size(2), width = images.size(3);
  // Reflection padding (not zeros) so the translated views contain no artificial border; reflection needs
  // H, W >= 2, checked above.
  const at::Tensor padded = at::reflection_pad2d(images, {1, 1, 1, 1});
  const at::Tensor top_left = padded.narrow(2, 0, height).narrow(3, 0, width);
  const at::Tensor bottom_right = padded.narrow(2, 2, height).narrow(3, 2, width);
  const at::Tensor translated = 0.5 * mirror_logits(model, top_left) + 0.5 * mirror_logits(model, bottom_right);
  return 0.5 * plain + 0.5 * translated;
}

}  // namespace cohort::models

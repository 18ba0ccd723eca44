#include "cohort/data/DeviceResident.h"

#include <ATen/ATen.h>

#include "cohort/util/Error.h"

namespace cohort::data {
namespace {

class DeviceResident final : public Source {
 public:
  DeviceResident(ImageDataset ds, c10::Device device, int64_t size)
      : name_(ds.name), num_classes_(ds.num_classes), n_(ds.size()), device_(device) {
    COHORT_ASSERT(ds.images.dim() == 4 && ds.images.scalar_type() == at::kByte,
                  "device_resident: dataset images must be uint8 [N, C, H, W]");
    images_ = ds.images.to(device).contiguous();
    labels_ = ds.labels.to(device);
    const int64_t c = images_.size(1);
    std::vector<float> table;
    for (const auto& t : normalize_tables(ds)) table.insert(table.end(), t.begin(), t.end());
    table_ = at::tensor(table).to(device);
    channel_base_ = (at::arange(c, at::kLong) * 256).view({1, c, 1, 1}).to(device);
    const auto along = at::TensorOptions().dtype(at::kLong).device(device);
    y_index_ = at::arange(images_.size(2), along);
    x_index_ = at::arange(images_.size(3), along);
    size_ = size > 0 ? size : images_.size(2);
  }

  int64_t size() const override { return n_; }
  int64_t num_classes() const override { return num_classes_; }
  int64_t channels() const override { return images_.size(1); }
  int64_t image_size() const override { return size_; }
  std::string name() const override { return name_ + " (on " + device_.str() + ")"; }

  Batch batch(const std::vector<int64_t>& indices, const AugmentOptions& aug) override {
    check_augment(aug);
    const auto count = static_cast<int64_t>(indices.size());
    // The indices and the per-sample draws, made on the host (augment_params: the host path's draws),
    // travel in one copy, from pinned memory on a GPU so that it does not wait for the device.
    auto host = at::empty({4, count}, at::TensorOptions().dtype(at::kLong).pinned_memory(device_.is_cuda()));
    // rows: index, dy, dx, flip; every entry written below
    auto* rows = host.data_ptr<int64_t>();
    for (int64_t b = 0; b < count; ++b) {
      const int64_t i = indices[b];
      COHORT_ASSERT(i >= 0 && i < n_,
                    "device_resident: sample index " + std::to_string(i) + " outside [0, " + std::to_string(n_) + ")");
      const auto a = augment_params(aug, i);  // identity when augmentation is off
      rows[b] = i, rows[count + b] = a.dy, rows[2 * count + b] = a.dx, rows[3 * count + b] = a.flip ? 1 : 0;
    }
    const auto params = device_.is_cuda() ? host.to(device_, /*non_blocking=*/true) : host;
    const auto idx = params[0];
    at::Tensor pixels = images_.index_select(0, idx);  // uint8 [B, C, H, W]
    const int64_t c = pixels.size(1), h = pixels.size(2), w = pixels.size(3);
    if (aug.enabled && count > 0) {
      // make_batch's transform as two gathers: out[b, :, y, x] = in[b, :, y + dy, x' + dx] with
      // x' = W-1-x under a flip, over a zero-padded copy so shifts outside the image read 0 intensity.
      const int64_t p = aug.crop_padding;
      const auto ys = y_index_.view({1, h}) + params[1].view({count, 1}) + p;
      const auto xs_plain = x_index_.view({1, w});
      const auto xs = xs_plain + params[3].view({count, 1}) * (w - 1 - 2 * xs_plain) + params[2].view({count, 1}) + p;
      auto padded = p > 0 ? at::constant_pad_nd(pixels, {p, p, p, p}, 0) : pixels;
      auto rows = padded.gather(2, ys.view({count, 1, h, 1}).expand({count, c, h, padded.size(3)}));
      pixels = rows.gather(3, xs.view({count, 1, 1, w}).expand({count, c, h, w}));
    }
    Batch out;
    // make_batch's normalization table, looked up on the device: entry channel * 256 + value.
    out.images = table_.take(pixels.to(at::kLong) + channel_base_);
    out.labels = labels_.index_select(0, idx);
    if (size_ != h || size_ != w)
      out.images = at::upsample_bilinear2d(out.images, {size_, size_}, /*align_corners=*/false);
    return out;
  }

 private:
  std::string name_;
  int64_t num_classes_, n_, size_ = 0;
  c10::Device device_;
  at::Tensor images_, labels_, table_, channel_base_;
  at::Tensor y_index_, x_index_;  // arange(H), arange(W) on the device, for the crop's gathers
};

}  // namespace

std::unique_ptr<Source> device_resident(ImageDataset dataset, c10::Device device, int64_t image_size) {
  return std::make_unique<DeviceResident>(std::move(dataset), device, image_size);
}

}  // namespace cohort::data

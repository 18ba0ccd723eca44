#include "cohort/data/Source.h"

#include <ATen/ATen.h>

namespace cohort::data {

namespace {
class InMemory final : public Source {
 public:
  InMemory(ImageDataset ds, int64_t size) : ds_(std::move(ds)), size_(size > 0 ? size : ds_.images.size(2)) {}
  int64_t size() const override { return ds_.size(); }
  int64_t num_classes() const override { return ds_.num_classes; }
  int64_t channels() const override { return ds_.images.size(1); }
  int64_t image_size() const override { return size_; }
  std::string name() const override { return ds_.name; }
  Batch batch(const std::vector<int64_t>& indices, const AugmentOptions& aug) override {
    Batch b = make_batch(ds_, indices, aug);
    if (size_ != ds_.images.size(2) || size_ != ds_.images.size(3))
      b.images = at::upsample_bilinear2d(b.images, {size_, size_}, /*align_corners=*/false);
    return b;
  }

 private:
  ImageDataset ds_;
  int64_t size_;
};
}  // namespace

std::unique_ptr<Source> in_memory(ImageDataset dataset, int64_t image_size) {
  return std::make_unique<InMemory>(std::move(dataset), image_size);
}

Loader::Loader(Source& source, std::vector<std::vector<int64_t>> batches, AugmentOptions aug, int64_t prefetch,
               bool pin)
    : source_(source),
      batches_(std::move(batches)),
      aug_(aug),
      depth_(static_cast<size_t>(std::max<int64_t>(0, prefetch))),
      pin_(pin) {
  if (depth_ > 0) thread_ = std::thread([this] { produce(); });
}

Loader::~Loader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  changed_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Loader::produce() {
  for (size_t i = 0; i < batches_.size(); ++i) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      changed_.wait(lock, [&] { return stop_ || ready_.size() < depth_; });
      if (stop_) return;
    }
    try {
      Batch b = make(i);
      std::lock_guard<std::mutex> lock(mu_);
      ready_.push_back(std::move(b));
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      error_ = std::current_exception();
      changed_.notify_all();
      return;
    }
    changed_.notify_all();
  }
}

Batch Loader::make(size_t i) {
  Batch b = source_.batch(batches_[i], aug_);
  if (pin_ && b.images.device().is_cpu()) {
    b.images = b.images.pin_memory();
    b.labels = b.labels.pin_memory();
  }
  return b;
}

std::optional<Batch> Loader::next() {
  if (next_index_ >= batches_.size()) return std::nullopt;
  if (depth_ == 0) return make(next_index_++);
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait(lock, [&] { return !ready_.empty() || error_; });
  if (ready_.empty() && error_) std::rethrow_exception(error_);
  Batch b = std::move(ready_.front());
  ready_.pop_front();
  ++next_index_;
  changed_.notify_all();
  return b;
}

}  // namespace cohort::data

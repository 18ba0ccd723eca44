// Where the trainer's batches come from, whatever the dataset: in-memory tensors (Fashion-MNIST, CIFAR-10)
// or JPEG files decoded on the fly (ImageNet-style folders). A Source turns sample indices into a
// normalized float batch; a Loader runs a Source ahead of training on a background thread with a bounded
// queue, so decoding overlaps the step.
//
//   auto src = cohort::data::in_memory(cohort::data::load_cifar10(root, true));
//   cohort::data::Loader loader(*src, batches_of_indices, aug, /*prefetch=*/2);
//   while (auto b = loader.next()) train_on(*b);
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cohort/data/Batch.h"

namespace cohort::data {

class Source {
 public:
  virtual ~Source() = default;
  virtual int64_t size() const = 0;
  virtual int64_t num_classes() const = 0;
  virtual int64_t channels() const = 0;
  virtual int64_t image_size() const = 0;  // height = width of the batches it produces
  virtual std::string name() const = 0;
  // The samples `indices`, augmented when `aug.enabled` (training) and plainly transformed otherwise.
  // A pure function of (indices, aug): the same on every rank and on every call.
  virtual Batch batch(const std::vector<int64_t>& indices, const AugmentOptions& aug) = 0;
  // Files that could not be read or decoded and were skipped so far (decoded datasets only).
  virtual int64_t bad_files() const { return 0; }
};

// An in-memory dataset; batch() is make_batch(), then, when `image_size` is not 0 and differs from the
// images' own size, a bilinear resize (CIFAR-10's 32 pixels to 224 for a ViT-B/32 pretrained at 224).
std::unique_ptr<Source> in_memory(ImageDataset dataset, int64_t image_size = 0);

// Produces source.batch(batches[i], aug) for i = 0, 1, ... in order. prefetch == 0: on the caller's thread
// when next() is called; prefetch > 0: up to that many batches ahead on a background thread. An exception
// in the background (a corrupt file under data.on_bad_file=fail) is rethrown by next().
// pin: copy each host batch into page-locked memory (on the background thread when there is one), as
// torch's DataLoader(pin_memory=True) does, so its copy to the GPU is asynchronous. Needs CUDA.
class Loader {
 public:
  Loader(Source& source, std::vector<std::vector<int64_t>> batches, AugmentOptions aug, int64_t prefetch,
         bool pin = false);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;
  std::optional<Batch> next();

 private:
  void produce();
  Source& source_;
  std::vector<std::vector<int64_t>> batches_;
  Batch make(size_t i);
  AugmentOptions aug_;
  size_t depth_;
  bool pin_;
  size_t next_index_ = 0;  // next batch handed out
  std::mutex mu_;
  std::condition_variable changed_;
  std::deque<Batch> ready_;
  std::exception_ptr error_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace cohort::data

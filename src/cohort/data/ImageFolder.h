// An ImageNet-style folder of JPEGs as a Source: one subfolder per class (classes sorted by name, so
// class i is the i-th folder as in torchvision's ImageFolder), files sorted within a class. Images are
// decoded on the fly with libjpeg-turbo, `workers` threads per batch; training batches get
// RandomResizedCrop + horizontal flip, evaluation batches resize + center crop (Jpeg.h, ImageTransforms.h),
// both normalized with ImageNet's statistics.
//
//   cohort::data::ImageFolder train("/data/imagenet/train", {.image_size = 224, .workers = 8}, /*limit=*/0);
//   auto b = train.batch({0, 1, 2}, aug);   // float [3, 3, 224, 224]
//
// A file that is not a JPEG (by extension) is left out at scan time; a file that fails to decode is,
// under skip_bad_files, replaced in its batch by the next sample that decodes and named in the log once;
// otherwise it is a cohort::DataError naming it.
#pragma once

#include <atomic>
#include <filesystem>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "cohort/data/ImageTransforms.h"
#include "cohort/data/Source.h"

namespace cohort::data {

// Whether a file name ends in .jpg or .jpeg, in any case (what an image folder scans for).
bool is_jpeg_name(const std::filesystem::path& p);
// A whole file's bytes; throws DataError naming it when it cannot be opened or read.
std::vector<uint8_t> read_file_bytes(const std::filesystem::path& p);

struct ImageFolderOptions {
  int64_t image_size = 224;
  // Resize, filter and normalization of both splits; crop_size is image_size (see data/Presets.h).
  TransformOptions transform;
  int64_t workers = 0;  // 0: hardware threads / local workers, at least 1
  bool skip_bad_files = true;
  int rank = 0;  // for log lines
  int local_world_size = 1;
};

class ImageFolder final : public Source {
 public:
  ImageFolder(const std::filesystem::path& dir, ImageFolderOptions options, int64_t limit = 0);

  int64_t size() const override { return static_cast<int64_t>(files_.size()); }
  int64_t num_classes() const override { return static_cast<int64_t>(classes_.size()); }
  int64_t channels() const override { return 3; }
  int64_t image_size() const override { return options_.image_size; }
  std::string name() const override { return "imagefolder:" + dir_.string(); }
  Batch batch(const std::vector<int64_t>& indices, const AugmentOptions& aug) override;

  const std::vector<std::string>& classes() const { return classes_; }
  const std::filesystem::path& file(int64_t i) const { return files_[i]; }
  int64_t label(int64_t i) const { return labels_[i]; }
  // Files left out at scan time (not JPEG by extension) and files that failed to decode so far.
  int64_t skipped_at_scan() const { return static_cast<int64_t>(skipped_.size()); }
  int64_t bad_files() const override { return bad_count_.load(); }

 private:
  // Decodes sample i into out (3 x S x S floats); false when the file is bad.
  bool decode(int64_t i, const AugmentOptions& aug, float* out, std::string* why) const;
  void report_bad(int64_t i, const std::string& why);

  std::filesystem::path dir_;
  ImageFolderOptions options_;
  std::vector<std::string> classes_;
  std::vector<std::filesystem::path> files_;
  std::vector<int64_t> labels_;
  std::vector<std::filesystem::path> skipped_;
  std::mutex bad_mu_;
  std::set<int64_t> bad_;
  std::atomic<int64_t> bad_count_{0};
};

}  // namespace cohort::data

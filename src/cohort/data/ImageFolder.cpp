#include "cohort/data/ImageFolder.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <iostream>
#include <thread>

#include <ATen/ATen.h>

#include "cohort/data/ImageTransforms.h"
#include "cohort/util/Error.h"
#include "cohort/util/Rng.h"

namespace cohort::data {
namespace fs = std::filesystem;

namespace {

// At most this many bad files are named one by one in the log; after that only the count grows.
constexpr int64_t kNamedBadFiles = 20;

}  // namespace

bool is_jpeg_name(const fs::path& p) {
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  return ext == ".jpg" || ext == ".jpeg";
}

std::vector<uint8_t> read_file_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary | std::ios::ate);
  if (!in) throw DataError("cannot open " + p.string());
  const auto size = static_cast<size_t>(in.tellg());
  std::vector<uint8_t> bytes(size);
  in.seekg(0);
  if (size > 0 && !in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(size)))
    throw DataError("cannot read " + p.string());
  return bytes;
}

ImageFolder::ImageFolder(const fs::path& dir, ImageFolderOptions options, int64_t limit)
    : dir_(dir), options_(options) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw DataError("image folder " + dir.string() + " does not exist",
                    "data.root must hold train/<class>/*.JPEG and val/<class>/*.JPEG (valprep.sh's layout)");
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_directory()) classes_.push_back(e.path().filename().string());
  std::sort(classes_.begin(), classes_.end());
  if (classes_.empty())
    throw DataError("image folder " + dir.string() + " has no class subfolders",
                    "put each class's images in a folder of its own: " + dir.string() + "/<class>/*.JPEG");
  for (size_t c = 0; c < classes_.size(); ++c) {
    std::vector<fs::path> files;
    for (const auto& e :
         fs::recursive_directory_iterator(dir / classes_[c], fs::directory_options::follow_directory_symlink)) {
      if (!e.is_regular_file()) continue;
      (is_jpeg_name(e.path()) ? files : skipped_).push_back(e.path());
    }
    std::sort(files.begin(), files.end());
    for (auto& f : files) {
      files_.push_back(std::move(f));
      labels_.push_back(static_cast<int64_t>(c));
    }
  }
  if (files_.empty())
    throw DataError("image folder " + dir.string() + " has no .jpg or .jpeg files in its " +
                        std::to_string(classes_.size()) + " class folders",
                    "cohort decodes JPEG only; convert other formats first");
  if (!skipped_.empty()) {
    if (!options_.skip_bad_files)
      throw DataError(
          skipped_.front().string() + " is not a JPEG file (by its name), and data.on_bad_file=fail",
          "remove the " + std::to_string(skipped_.size()) + " non-JPEG file(s), or pass data.on_bad_file=skip");
    if (options_.rank == 0)
      std::cerr << "cohort: note: " << dir.string() << ": left out " << skipped_.size()
                << " file(s) that are not .jpg/.jpeg, e.g. " << skipped_.front().string() << std::endl;
  }
  if (limit > 0 && static_cast<int64_t>(files_.size()) > limit) {
    // The first `limit` of a class-sorted list would hold only the first classes: take an even stride
    // through it instead, so a short run still sees every class.
    std::vector<fs::path> f;
    std::vector<int64_t> l;
    for (int64_t i = 0; i < limit; ++i) {
      const auto at = static_cast<size_t>(i * static_cast<int64_t>(files_.size()) / limit);
      f.push_back(files_[at]);
      l.push_back(labels_[at]);
    }
    files_ = std::move(f);
    labels_ = std::move(l);
  }
}

bool ImageFolder::decode(int64_t i, const AugmentOptions& aug, float* out, std::string* why) const {
  TransformOptions t = options_.transform;
  t.crop_size = static_cast<int>(options_.image_size);
  try {
    const auto bytes = read_file_bytes(files_[i]);
    if (aug.enabled)
      train_transform(bytes.data(), bytes.size(),
                      util::mix_seed(aug.seed, static_cast<uint64_t>(aug.epoch), static_cast<uint64_t>(i)), t, out);
    else
      val_transform(bytes.data(), bytes.size(), t, out);
    return true;
  } catch (const Error& e) {
    *why = e.what();
    return false;
  }
}

void ImageFolder::report_bad(int64_t i, const std::string& why) {
  std::lock_guard<std::mutex> lock(bad_mu_);
  if (!bad_.insert(i).second) return;  // named once
  const int64_t n = ++bad_count_;
  if (n <= kNamedBadFiles)
    std::cerr << "cohort: rank " << options_.rank << ": skipping bad image " << files_[i].string() << ": " << why
              << (n == kNamedBadFiles ? " (further bad files are only counted)" : "") << std::endl;
}

Batch ImageFolder::batch(const std::vector<int64_t>& indices, const AugmentOptions& aug) {
  const int64_t n = static_cast<int64_t>(indices.size());
  const int64_t s = options_.image_size;
  Batch b;
  b.images = at::empty({n, 3, s, s}, at::kFloat);
  b.labels = at::empty({n}, at::kLong);
  float* images = b.images.data_ptr<float>();
  int64_t* labels = b.labels.data_ptr<int64_t>();
  int64_t threads = options_.workers;
  if (threads <= 0)
    threads = std::max<int64_t>(1, std::thread::hardware_concurrency() / std::max(1, options_.local_world_size));
  threads = std::min(threads, n);

  std::mutex error_mu;
  std::string error;
  auto work = [&](int64_t t) {
    for (int64_t k = t; k < n; k += threads) {
      // A bad file is replaced by the next sample that decodes, so the batch keeps its size (every rank
      // must run the same number of samples per step) and the choice is the same on every run.
      int64_t i = indices[k];
      std::string why;
      for (int64_t tries = 0; tries < size(); ++tries, i = (i + 1) % size()) {
        if (decode(i, aug, images + k * 3 * s * s, &why)) break;
        if (!options_.skip_bad_files) {
          std::lock_guard<std::mutex> lock(error_mu);
          if (error.empty()) error = files_[i].string() + ": " + why;
          return;
        }
        report_bad(i, why);
      }
      labels[k] = labels_[i];
    }
  };
  if (threads <= 1) {
    work(0);
  } else {
    std::vector<std::thread> pool;
    for (int64_t t = 0; t < threads; ++t) pool.emplace_back(work, t);
    for (auto& th : pool) th.join();
  }
  if (!error.empty())
    throw DataError("bad image " + error + " (data.on_bad_file=fail)",
                    "remove or replace the file, or pass data.on_bad_file=skip to skip bad files");
  if (bad_count_.load() >= size())
    throw DataError("no image in " + dir_.string() + " decodes", "check that the files are JPEGs");
  return b;
}

}  // namespace cohort::data

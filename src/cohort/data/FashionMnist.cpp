#include "cohort/data/FashionMnist.h"

#include <ATen/ATen.h>

#include <system_error>

#include "cohort/data/Idx.h"
#include "cohort/util/Error.h"

namespace cohort::data {
namespace {

namespace fs = std::filesystem;

constexpr const char* kInstallHint =
    "install the dataset with `apt-get install dataset-fashion-mnist` (it lands in "
    "/usr/share/datasets/fashion-mnist), or pass data.root=DIR for a folder holding "
    "train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz and "
    "t10k-labels-idx1-ubyte.gz";

constexpr const char* kMismatchHint =
    "the image and label files come from different downloads or one is damaged: reinstall "
    "dataset-fashion-mnist or re-download both files";

// Debian ships the gzipped files; a manual download is often already gunzipped. Either is fine.
fs::path find_file(const fs::path& root, const std::string& stem) {
  std::error_code ec;
  for (const fs::path& candidate : {root / (stem + ".gz"), root / stem}) {
    if (fs::is_regular_file(candidate, ec)) return candidate;
  }
  throw DataError("Fashion-MNIST file " + (root / stem).string() + "[.gz] not found (neither " + stem + ".gz nor " +
                      stem + " is in " + root.string() + ")",
                  kInstallHint);
}

}  // namespace

ImageDataset load_fashion_mnist(const fs::path& root, bool train, int64_t limit) {
  if (limit < 0) {
    throw ConfigError("data.limit must be >= 0 (0 means all samples), got " + std::to_string(limit),
                      "pass data.limit=0 to use the whole dataset");
  }
  std::error_code ec;
  if (!fs::exists(root, ec)) {
    throw DataError("Fashion-MNIST directory " + root.string() + " does not exist", kInstallHint);
  }
  if (!fs::is_directory(root, ec)) {
    throw DataError("Fashion-MNIST root " + root.string() + " is not a directory", kInstallHint);
  }

  const std::string split = train ? "train" : "t10k";
  const fs::path image_path = find_file(root, split + "-images-idx3-ubyte");
  const fs::path label_path = find_file(root, split + "-labels-idx1-ubyte");
  IdxArray images = read_idx(image_path);
  IdxArray labels = read_idx(label_path);

  if (images.dims.size() != 3) {
    throw DataError("Fashion-MNIST image file " + image_path.string() + " has " + std::to_string(images.dims.size()) +
                        " dimensions; expected 3 [N, H, W]",
                    kMismatchHint);
  }
  if (labels.dims.size() != 1) {
    throw DataError("Fashion-MNIST label file " + label_path.string() + " has " + std::to_string(labels.dims.size()) +
                        " dimensions; expected 1 [N]",
                    kMismatchHint);
  }
  const int64_t n = images.dims[0];
  if (labels.dims[0] != n) {
    throw DataError("Fashion-MNIST files disagree on the number of samples: " + image_path.string() + " has " +
                        std::to_string(n) + " images but " + label_path.string() + " has " +
                        std::to_string(labels.dims[0]) + " labels",
                    kMismatchHint);
  }
  const uint8_t* label_bytes = labels.data.data_ptr<uint8_t>();
  for (int64_t i = 0; i < n; ++i) {
    if (label_bytes[i] >= kFashionMnistClasses) {
      throw DataError("Fashion-MNIST label file " + label_path.string() + " has label " +
                          std::to_string(label_bytes[i]) + " at index " + std::to_string(i) +
                          "; labels must be in [0, " + std::to_string(kFashionMnistClasses) + ")",
                      kMismatchHint);
    }
  }

  ImageDataset out;
  out.images = images.data.view({n, 1, images.dims[1], images.dims[2]});
  out.labels = labels.data.to(at::kLong);
  if (limit > 0 && limit < n) {
    // clone() so the dropped samples' memory is released rather than kept alive by a view.
    out.images = out.images.narrow(0, 0, limit).clone();
    out.labels = out.labels.narrow(0, 0, limit).clone();
  }
  out.num_classes = kFashionMnistClasses;
  out.name = train ? "fashion-mnist/train" : "fashion-mnist/test";
  out.mean = kFashionMnistMean;
  out.std = kFashionMnistStd;
  return out;
}

}  // namespace cohort::data

#include "cohort/data/Cifar10.h"

#include <ATen/ATen.h>

#include <cstring>
#include <fstream>

#include "cohort/util/Error.h"

namespace cohort::data {
namespace fs = std::filesystem;

namespace {
const char* kHint =
    "point data.root at the extracted cifar-10-binary.tar.gz (the folder cifar-10-batches-bin), from "
    "https://www.cs.toronto.edu/~kriz/cifar.html";
}

void read_cifar10_bytes(std::string_view bytes, const std::string& source, std::vector<uint8_t>& images,
                        std::vector<int64_t>& labels) {
  const auto size = bytes.size();
  if (size == 0 || size % kCifarRecordBytes != 0)
    throw DataError("CIFAR-10 file " + source + " has " + std::to_string(size) + " bytes, not a whole number of " +
                        std::to_string(kCifarRecordBytes) + "-byte records: record " +
                        std::to_string(size / kCifarRecordBytes) + " is cut off (truncated download?)",
                    kHint);
  const int64_t records = static_cast<int64_t>(size / kCifarRecordBytes);
  const auto* buf = reinterpret_cast<const uint8_t*>(bytes.data());
  const size_t first = images.size();
  images.resize(first + static_cast<size_t>(records) * (kCifarRecordBytes - 1));
  for (int64_t r = 0; r < records; ++r) {
    const uint8_t* rec = buf + r * kCifarRecordBytes;
    if (rec[0] >= kCifarClasses)
      throw DataError("CIFAR-10 file " + source + ": record " + std::to_string(r) + " has label " +
                          std::to_string(rec[0]) + ", outside 0..9 (is this CIFAR-100 or another format?)",
                      kHint);
    labels.push_back(rec[0]);
    std::memcpy(images.data() + first + r * (kCifarRecordBytes - 1), rec + 1, kCifarRecordBytes - 1);
  }
}

void read_cifar10_file(const fs::path& file, std::vector<uint8_t>& images, std::vector<int64_t>& labels) {
  std::error_code ec;
  const auto size = fs::file_size(file, ec);
  if (ec) throw DataError("CIFAR-10 file " + file.string() + " cannot be read: " + ec.message(), kHint);
  std::string buf(static_cast<size_t>(size), '\0');
  std::ifstream in(file, std::ios::binary);
  if (!in.read(buf.data(), static_cast<std::streamsize>(size)))
    throw DataError("CIFAR-10 file " + file.string() + " could not be read to its end", kHint);
  read_cifar10_bytes(buf, file.string(), images, labels);
}

ImageDataset load_cifar10(const fs::path& root_in, bool train, int64_t limit) {
  fs::path root = root_in;
  if (!fs::exists(root / "test_batch.bin") && fs::exists(root / "cifar-10-batches-bin")) root /= "cifar-10-batches-bin";
  std::vector<fs::path> files;
  if (train)
    for (int i = 1; i <= 5; ++i) files.push_back(root / ("data_batch_" + std::to_string(i) + ".bin"));
  else
    files.push_back(root / "test_batch.bin");
  std::vector<uint8_t> images;
  std::vector<int64_t> labels;
  for (const auto& f : files) {
    if (!fs::exists(f)) throw DataError("CIFAR-10 file " + f.string() + " does not exist", kHint);
    read_cifar10_file(f, images, labels);
    if (limit > 0 && static_cast<int64_t>(labels.size()) >= limit) break;
  }
  int64_t n = static_cast<int64_t>(labels.size());
  if (limit > 0) n = std::min(n, limit);
  ImageDataset ds;
  ds.images = at::empty({n, 3, 32, 32}, at::kByte);
  std::memcpy(ds.images.data_ptr<uint8_t>(), images.data(), static_cast<size_t>(n) * 3 * 32 * 32);
  ds.labels = at::empty({n}, at::kLong);
  std::memcpy(ds.labels.data_ptr<int64_t>(), labels.data(), static_cast<size_t>(n) * sizeof(int64_t));
  ds.num_classes = kCifarClasses;
  ds.name = "cifar10";
  ds.channel_mean.assign(kCifarMean, kCifarMean + 3);
  ds.channel_std.assign(kCifarStd, kCifarStd + 3);
  ds.mean = kCifarMean[0];
  ds.std = kCifarStd[0];
  return ds;
}

}  // namespace cohort::data

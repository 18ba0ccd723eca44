// CIFAR-10 from its binary distribution (cifar-10-binary.tar.gz, extracted): data_batch_1.bin ...
// data_batch_5.bin for training and test_batch.bin for testing, each record 1 label byte then 3072 pixel
// bytes (1024 red, 1024 green, 1024 blue, row-major 32x32), which is already the CHW layout we keep.
//
//   auto train = cohort::data::load_cifar10("/data/cifar-10-batches-bin", /*train=*/true);
//   // train.images: uint8 [50000, 3, 32, 32]; train.labels: int64 [50000]; per-channel mean and std set
//
// A missing file, a size that is not a whole number of records, or a label outside 0..9 is a
// cohort::DataError naming the file and the record.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

#include "cohort/data/FashionMnist.h"

namespace cohort::data {

inline constexpr int64_t kCifarRecordBytes = 1 + 3 * 32 * 32;
inline constexpr int64_t kCifarClasses = 10;
// The training set's per-channel statistics, in [0, 1] units (the values airbench and most recipes use).
inline constexpr float kCifarMean[3] = {0.4914f, 0.4822f, 0.4465f};
inline constexpr float kCifarStd[3] = {0.2470f, 0.2435f, 0.2616f};

// `root` may be the folder holding the .bin files or its parent (the tarball extracts into
// cifar-10-batches-bin/). limit > 0 keeps the first `limit` records.
ImageDataset load_cifar10(const std::filesystem::path& root, bool train, int64_t limit = 0);

// Reads one batch file; appends its images and labels. Exposed for tests.
void read_cifar10_file(const std::filesystem::path& file, std::vector<uint8_t>& images, std::vector<int64_t>& labels);

// The same checks on a batch file's bytes in memory (the fuzzer's entry point; read_cifar10_file reads
// the file and calls it). `source_name` names the bytes in error messages, usually the path.
void read_cifar10_bytes(std::string_view bytes, const std::string& source_name, std::vector<uint8_t>& images,
                        std::vector<int64_t>& labels);

}  // namespace cohort::data

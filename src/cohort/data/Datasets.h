// The datasets a config names, opened as train and test Sources: fashion-mnist and mnist (IDX files),
// cifar10 (binary batches), imagefolder (data.root/train and data.root/val with one folder per class).
//
//   auto d = cohort::data::open_datasets(cfg, info.rank, info.local_world_size);
//   d.train->size(); d.test->batch(indices, {});
#pragma once

#include <memory>

#include <c10/core/Device.h>

#include "cohort/config/Config.h"
#include "cohort/data/Source.h"

namespace cohort::data {

struct Splits {
  std::unique_ptr<Source> train;
  std::unique_ptr<Source> test;
};

// Throws cohort::DataError naming a missing or malformed file, cohort::ConfigError for a dataset that
// does not fit the config (model.num_classes smaller than the classes found).
// need_train=false (`cohort eval`) leaves `train` empty. Under data.device_resident the in-memory
// datasets are kept whole on `device` (data/DeviceResident.h).
Splits open_datasets(const TrainConfig& cfg, int rank, int local_world_size, bool need_train = true,
                     c10::Device device = c10::Device(c10::kCPU));

}  // namespace cohort::data

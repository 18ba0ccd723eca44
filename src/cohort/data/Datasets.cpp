#include "cohort/data/Datasets.h"

#include "cohort/data/Cifar10.h"
#include "cohort/data/DeviceResident.h"
#include "cohort/data/FashionMnist.h"
#include "cohort/data/ImageFolder.h"
#include "cohort/data/Presets.h"
#include "cohort/util/Error.h"

namespace cohort::data {

Splits open_datasets(const TrainConfig& cfg, int rank, int local_world_size, bool need_train, c10::Device device) {
  const auto& d = cfg.data;
  Splits s;
  // An in-memory dataset, kept on the host or on the training device.
  auto held = [&](ImageDataset ds, int64_t image_size) {
    return d.device_resident ? device_resident(std::move(ds), device, image_size)
                             : data::in_memory(std::move(ds), image_size);
  };
  if (d.name == "fashion-mnist" || d.name == "mnist") {
    for (const bool train : {true, false}) {
      if (train && !need_train) continue;
      auto ds = load_fashion_mnist(d.root, train, train ? d.train_limit : d.test_limit);
      ds.name = d.name;
      if (d.name == "mnist") ds.mean = kMnistMean, ds.std = kMnistStd;
      (train ? s.train : s.test) = held(std::move(ds), d.image_size);
    }
  } else if (d.name == "cifar10") {
    if (d.root == kDefaultFashionMnistRoot)
      throw ConfigError("data.name=cifar10 needs data.root: it is still the Fashion-MNIST folder " + d.root,
                        "pass data.root=<the extracted cifar-10-batches-bin folder>");
    if (need_train) s.train = held(load_cifar10(d.root, /*train=*/true, d.train_limit), d.image_size);
    s.test = held(load_cifar10(d.root, /*train=*/false, d.test_limit), d.image_size);
  } else if (d.name == "imagefolder") {
    ImageFolderOptions o;
    o.image_size = d.image_size > 0 ? d.image_size : 224;
    o.transform = model_transform(cfg.model.name, static_cast<int>(o.image_size));
    o.workers = d.workers;
    o.skip_bad_files = d.on_bad_file == "skip";
    o.rank = rank;
    o.local_world_size = local_world_size;
    auto val = std::make_unique<ImageFolder>(std::filesystem::path(d.root) / "val", o, d.test_limit);
    if (need_train) {
      auto train = std::make_unique<ImageFolder>(std::filesystem::path(d.root) / "train", o, d.train_limit);
      if (train->classes() != val->classes())
        throw DataError("the class folders of " + (std::filesystem::path(d.root) / "train").string() + " (" +
                            std::to_string(train->num_classes()) + ") and of " +
                            (std::filesystem::path(d.root) / "val").string() + " (" +
                            std::to_string(val->num_classes()) + ") differ",
                        "train/ and val/ need the same class folders (valprep.sh makes them)");
      s.train = std::move(train);
    }
    s.test = std::move(val);
  } else {
    throw ConfigError("data.name '" + d.name + "' is not a dataset cohort knows",
                      "use fashion-mnist, mnist, cifar10 or imagefolder");
  }
  const Source& any = s.train ? *s.train : *s.test;
  if (any.num_classes() > cfg.model.num_classes)
    throw ConfigError("the " + d.name + " dataset has " + std::to_string(any.num_classes()) +
                          " classes but model.num_classes is " + std::to_string(cfg.model.num_classes),
                      "pass model.num_classes=" + std::to_string(any.num_classes()));
  return s;
}

}  // namespace cohort::data

#include "cohort/train/InitialWeights.h"

#include <iostream>

#include "cohort/models/Airbench.h"

namespace cohort::train {
namespace {

// Initial weights for fine-tuning. A classifier head of another class count (1000 ImageNet classes in
// the file, 10 here) keeps its fresh initialization; every other tensor must match by name and shape.
void load_pretrained(models::Classifier& model, const std::string& path, bool lead) {
  const auto file = checkpoint::load_safetensors(path);
  const auto replaced =
      checkpoint::load_weights(model, file.tensors, path, {"fc.weight", "fc.bias", "head.weight", "head.bias"});
  if (!lead) return;
  std::cout << "cohort: pretrained weights from " << path << " (" << file.tensors.size() << " tensors)";
  for (size_t i = 0; i < replaced.size(); ++i) std::cout << (i ? ", " : "; new classifier head: ") << replaced[i];
  std::cout << std::endl;
}

// airbench's first layer whitens 2x2 patches with statistics of the training images: the same first
// images (no augmentation) on every rank, so every rank computes the same weights.
void whiten_from_data(models::AirbenchNet& net, data::Source& train) {
  std::vector<int64_t> first(static_cast<size_t>(std::min<int64_t>(5000, train.size())));
  for (size_t i = 0; i < first.size(); ++i) first[i] = static_cast<int64_t>(i);
  net.init_whitening(train.batch(first, data::AugmentOptions{}).images.cpu());  // the model is still on the host
}

}  // namespace

void initial_weights(models::Classifier& model, const TrainConfig& cfg, data::Source& train,
                     const checkpoint::NamedTensors* resumed, const std::string& source, bool lead) {
  if (resumed)
    checkpoint::load_weights(model, *resumed, source);
  else if (!cfg.model.pretrained.empty())
    load_pretrained(model, cfg.model.pretrained, lead);
  else if (auto* airbench = dynamic_cast<models::AirbenchNet*>(&model))
    whiten_from_data(*airbench, train);
}

}  // namespace cohort::train

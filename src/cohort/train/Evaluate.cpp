#include "cohort/train/Evaluate.h"

#include <algorithm>

#include <torch/torch.h>

#include "cohort/models/TestTimeAugmentation.h"
#include "cohort/train/Device.h"

namespace cohort::train {

std::vector<std::vector<int64_t>> batches_of(const std::vector<int64_t>& order, int64_t size, int64_t first,
                                             int64_t count) {
  std::vector<std::vector<int64_t>> out;
  for (int64_t b = first; b < first + count; ++b) {
    const int64_t begin = b * size;
    const int64_t n = std::min<int64_t>(size, static_cast<int64_t>(order.size()) - begin);
    if (n <= 0) break;
    out.emplace_back(order.begin() + begin, order.begin() + begin + n);
  }
  return out;
}

record::MetricSums evaluate(models::Classifier& model, data::Source& test, const data::DistributedSampler& sampler,
                            int64_t batch_size, int64_t prefetch, int64_t tta, comm::Communicator& comm,
                            const EvalPlacement& place) {
  torch::NoGradGuard no_grad;
  model.eval();
  record::MetricWindow window;
  const auto mine = sampler.eval_indices();
  const int64_t count = (static_cast<int64_t>(mine.size()) + batch_size - 1) / batch_size;
  data::Loader loader(test, batches_of(mine, batch_size, 0, count), data::AugmentOptions{}, prefetch,
                      /*pin=*/place.device.is_cuda());
  while (auto batch = loader.next()) {
    auto images = images_to(batch->images, place.device, place.channels_last);
    const auto labels = batch->labels.to(place.device, /*non_blocking=*/batch->labels.is_pinned());
    at::Tensor logits;
    {
      auto autocast = place.precision ? place.precision->autocast() : nullptr;
      if (place.precision) images = place.precision->input(images);
      logits = tta > 0 ? models::tta_logits(model, images, static_cast<int>(tta)) : model.forward(images);
    }
    if (place.precision) logits = place.precision->logits(logits);
    // The window weights each batch's mean by its size, so the global average is exact whatever the
    // per-rank batch counts.
    auto loss = torch::nn::functional::cross_entropy(logits, labels);
    window.add(logits, labels, loss.item<double>());
  }
  model.train();
  return window.reduce(comm, "evaluation metrics");
}

}  // namespace cohort::train

#include "cohort/data/DistributedSampler.h"

#include <algorithm>
#include <numeric>
#include <string>
#include <utility>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "cohort/util/Error.h"

namespace cohort::data {

DistributedSampler::DistributedSampler(int64_t dataset_size, int world_size, int rank, bool shuffle, uint64_t seed,
                                       bool drop_last)
    : dataset_size_(dataset_size),
      world_size_(world_size),
      rank_(rank),
      shuffle_(shuffle),
      seed_(seed),
      drop_last_(drop_last),
      num_samples_(0) {
  // World size and rank come from the communication layer, never from the user.
  COHORT_ASSERT(world_size >= 1, "DistributedSampler: world_size must be >= 1, got " + std::to_string(world_size));
  COHORT_ASSERT(rank >= 0 && rank < world_size, "DistributedSampler: rank " + std::to_string(rank) + " outside [0, " +
                                                    std::to_string(world_size) + ")");
  if (dataset_size <= 0) {
    throw ConfigError("DistributedSampler: the dataset is empty (" + std::to_string(dataset_size) + " samples)",
                      "check data.root and data.limit");
  }
  if (drop_last && dataset_size < world_size) {
    // Every rank would get zero samples and the epoch would silently do nothing.
    throw ConfigError("DistributedSampler: drop_last with " + std::to_string(dataset_size) +
                          " samples and world size " + std::to_string(world_size) + " leaves no sample per rank",
                      "use more samples (data.limit) or fewer ranks, or turn drop_last off");
  }
  num_samples_ = drop_last ? dataset_size / world_size : (dataset_size + world_size - 1) / world_size;
}

std::vector<int64_t> DistributedSampler::permutation(int64_t epoch) const {
  std::vector<int64_t> perm(static_cast<size_t>(dataset_size_));
  if (!shuffle_) {
    std::iota(perm.begin(), perm.end(), int64_t{0});
    return perm;
  }
  // torch.utils.data.DistributedSampler's own order: torch.randperm(N) drawn from a CPU generator seeded
  // with seed + epoch, so a cohort run visits the samples a PyTorch run with the same seed visits. The
  // generator is made here from (seed, epoch) alone, so every rank gets this permutation without
  // communicating; LibTorch 1.13 to 2.14 give the same permutation (tests/reference/sampler.py).
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed_ + static_cast<uint64_t>(epoch));
  const at::Tensor p = at::randperm(dataset_size_, gen, at::TensorOptions().dtype(at::kLong));
  std::copy_n(p.data_ptr<int64_t>(), dataset_size_, perm.begin());
  return perm;
}

std::vector<int64_t> DistributedSampler::indices(int64_t epoch) const {
  const std::vector<int64_t> perm = permutation(epoch);
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(num_samples_));
  // Position k of the padded list is perm[k % N]: padding repeats the permutation from its start, which
  // is exactly PyTorch's `indices += indices[:padding]` (repeated when padding exceeds N). With
  // drop_last, total_size() <= N and the modulo never wraps.
  const int64_t total = total_size();
  for (int64_t k = rank_; k < total; k += world_size_) {
    mine.push_back(perm[static_cast<size_t>(k % dataset_size_)]);
  }
  COHORT_ASSERT(static_cast<int64_t>(mine.size()) == num_samples_, "DistributedSampler: wrong shard size");
  return mine;
}

std::vector<int64_t> DistributedSampler::eval_indices() const {
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(dataset_size_ / world_size_ + 1));
  for (int64_t k = rank_; k < dataset_size_; k += world_size_) mine.push_back(k);
  return mine;
}

int64_t DistributedSampler::num_batches(int64_t batch_size, bool drop_last_batch) const {
  if (batch_size <= 0) {
    throw ConfigError("data.batch_size must be positive, got " + std::to_string(batch_size),
                      "pass data.batch_size=128");
  }
  return drop_last_batch ? num_samples_ / batch_size : (num_samples_ + batch_size - 1) / batch_size;
}

}  // namespace cohort::data

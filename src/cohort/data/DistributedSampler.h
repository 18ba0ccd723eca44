// Which dataset samples each rank trains on in an epoch, with PyTorch's DistributedSampler semantics:
// one permutation per epoch, identical on every rank because it is a pure function of (seed, epoch),
// padded or truncated to a multiple of the world size, then dealt out round-robin. No tensors and no
// communication, so it is unit-tested on its own and every rank computes the same plan by construction.
//
//   cohort::data::DistributedSampler sampler(60000, world_size, rank, /*shuffle=*/true, seed,
//                                            /*drop_last=*/false);
//   std::vector<int64_t> mine = sampler.indices(epoch);  // sampler.num_samples() entries
//   for (int64_t b = 0; b < sampler.num_batches(batch_size, false); ++b) { ... mine[b * batch_size] ... }
#pragma once

#include <cstdint>
#include <vector>

namespace cohort::data {

class DistributedSampler {
 public:
  // drop_last=false pads the permutation by repeating its first entries up to ceil(N/W)*W, so a few
  // samples count twice; drop_last=true truncates it to floor(N/W)*W, so a few are skipped this epoch.
  // Either way every rank gets the same number of samples, which keeps the ranks' collectives in step.
  // Throws cohort::ConfigError when the dataset is empty, or smaller than the world with drop_last.
  DistributedSampler(int64_t dataset_size, int world_size, int rank, bool shuffle, uint64_t seed, bool drop_last);

  // This rank's sample indices for `epoch`: positions rank, rank+W, rank+2W, ... of the padded or
  // truncated permutation, exactly what torch.utils.data.DistributedSampler gives (torch.randperm from a
  // generator seeded with seed + epoch), so the result does not depend on which epochs were computed
  // before (resuming mid-run gives the same order).
  std::vector<int64_t> indices(int64_t epoch) const;

  // For evaluation: positions rank, rank+W, ... of [0, N) in order, with no padding and no dropping, so
  // every sample is counted exactly once across ranks. Ranks may get counts differing by one, which is
  // why the evaluation loop sums (correct, count) across ranks instead of averaging per-rank accuracy.
  std::vector<int64_t> eval_indices() const;

  // Entries indices() returns on each rank: ceil(N/W) without drop_last, floor(N/W) with it.
  int64_t num_samples() const { return num_samples_; }
  // Length of the padded or truncated permutation, num_samples() * world_size.
  int64_t total_size() const { return num_samples_ * world_size_; }
  // Batches per epoch on each rank; drop_last_batch drops a final partial batch.
  int64_t num_batches(int64_t batch_size, bool drop_last_batch) const;

  int64_t dataset_size() const { return dataset_size_; }
  int world_size() const { return world_size_; }
  int rank() const { return rank_; }

  // The full permutation of [0, N) for an epoch, the same on every rank (identity without shuffle).
  std::vector<int64_t> permutation(int64_t epoch) const;

 private:
  int64_t dataset_size_;
  int world_size_;
  int rank_;
  bool shuffle_;
  uint64_t seed_;
  bool drop_last_;
  int64_t num_samples_;
};

}  // namespace cohort::data

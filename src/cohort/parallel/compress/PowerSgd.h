// PowerSGD gradient compression (Vogels et al., 2019) as a DDP communication hook, with the options of
// PyTorch's powerSGD_hook: each matrix-shaped gradient M (n x m; conv kernels as [out, in*kh*kw]) is
// sent as two thin factors P = M Q (n x r) and Q = M^T P (m x r) instead of n x m values.
//
//   cohort::parallel::compress::PowerSgdOptions o;  o.rank = 2;  o.start_iter = 300;
//   ddp.set_comm_hook(std::make_shared<cohort::parallel::compress::PowerSgdHook>(o));
//
// Per bucket and step: add the residual kept from the last step (error feedback); P = M Q with Q from
// the last step (warm start) or seeded random; all-reduce P; orthogonalize P; Q = M^T P; all-reduce Q;
// M ~ P Q^T / W. Vectors, small tensors and matrices where (n + m) r x min_compression_rate >= n m go
// through an ordinary all-reduce, and so does everything for the first start_iter steps.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "cohort/parallel/ddp/CommHook.h"
#include "cohort/util/OldNames.h"  // the names of the last release, for programs outside this tree

namespace cohort::parallel::compress {

struct PowerSgdOptions {
  int64_t rank = 1;                   // matrix_approximation_rank
  int64_t start_iter = 1000;          // start_powerSGD_iter: plain all-reduce before this many steps
  double min_compression_rate = 2.0;  // compress only where n m >= (n + m) r x this
  bool error_feedback = true;
  bool warm_start = true;
  uint64_t seed = 0;  // the random initial Q; the same on every rank
};

// How one gradient of a bucket is sent: a pure function of its shape and the options, so every rank
// decides alike.
struct MatrixPlan {
  int64_t n = 0, m = 0, r = 0;  // the gradient viewed as n x m; r = min(n, m, rank)
  bool compress = false;
};
std::vector<MatrixPlan> plan_matrices(const std::vector<std::vector<int64_t>>& shapes, const PowerSgdOptions& o);
// Values this rank all-reduces per step for these gradients once compression has started.
int64_t compressed_numel(const std::vector<MatrixPlan>& plan);

class PowerSgdHook : public parallel::ddp::CommHook {
 public:
  explicit PowerSgdHook(PowerSgdOptions options);
  std::string name() const override { return "powersgd"; }
  void attach(const std::vector<parallel::ddp::GradBucket>& buckets, comm::Communicator& comm) override;
  comm::HandlePtr run(comm::Communicator& comm, parallel::ddp::GradBucket& bucket) override;
  // The P all-reduce's wait launches the Q all-reduce.
  bool wait_issues_collectives() const override { return true; }
  void end_of_backward() override { ++iter_; }
  parallel::ddp::HookState state_dict(comm::Communicator& comm) override;
  void load_state_dict(const parallel::ddp::HookState& state, comm::Communicator& comm) override;

  int64_t iteration() const { return iter_; }
  // The residual this rank carries into the next step, per bucket (flat, as the bucket).
  const at::Tensor& error(size_t bucket) const { return buckets_.at(bucket).error; }

 private:
  struct BucketState {
    std::vector<std::string> names;
    std::vector<MatrixPlan> plan;
    at::Tensor error;           // flat residual, bucket-shaped (error feedback)
    at::Tensor q_flat;          // every compressed gradient's Q, [m x r] each, back to back (warm start)
    std::vector<at::Tensor> q;  // views of q_flat
    bool q_valid = false;       // q holds last step's Q (else it is drawn afresh)
  };
  void init_q(size_t bucket, BucketState& st);

  PowerSgdOptions options_;
  std::vector<BucketState> buckets_;
  int64_t iter_ = 0;
};

}  // namespace cohort::parallel::compress

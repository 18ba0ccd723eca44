// The gradient reducer behind DistributedDataParallel: autograd hooks fill flat buckets during
// backward, and each full bucket's all-reduce is launched at once, so communication overlaps the rest
// of backward. Users meet it through DistributedDataParallel; tests drive it directly.
//
//   cohort::parallel::ddp::Reducer reducer(params, names, comm, cohort::parallel::ddp::ReducerOptions{});
//   loss.backward();   // hooks launch buckets; a callback at the end of backward waits and writes grads
//
// The chain of steps (c10d reducer.cpp's shape): hook -> mark_ready(param) -> bucket pending count
// reaches zero -> launch_ready_buckets() strictly in order -> finalize() when the backward ends.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "cohort/comm/Communicator.h"
#include "cohort/parallel/BucketPlan.h"
#include "cohort/parallel/ddp/CommHook.h"
#include "cohort/util/OldNames.h"  // the names of the last release, for programs outside this tree

namespace cohort::parallel::ddp {

struct ReducerOptions {
  int64_t bucket_cap_bytes = 25ll << 20;
  int64_t first_bucket_cap_bytes = 1ll << 20;
  int64_t last_bucket_cap_bytes = 0;  // > 0: a small last bucket too (plan_buckets)
  // Launch buckets during backward (true) or all of them after it (false, for measuring the overlap).
  bool overlap = true;
  // Parameters without a gradient in a synchronized backward are reduced as zeros instead of failing.
  bool find_unused_parameters = false;
};

// What happened in the last synchronized backward, in seconds since it started; tests use it to show
// that communication really starts before backward ends.
struct BackwardTrace {
  std::vector<double> bucket_launch_s;  // per bucket, in launch order
  double last_hook_s = 0;               // when the last gradient was produced
  double finalize_s = 0;                // when backward finished and the reducer began waiting
  int64_t finished_in_backward = 0;     // buckets handed to on_bucket_reduced before backward finished
  int64_t bytes_reduced = 0;            // bytes this rank put into collectives (after compression)
  int64_t bytes_dense = 0;              // the buckets' own size: what an uncompressed all-reduce sends
};

class Reducer {
 public:
  Reducer(std::vector<at::Tensor> params, std::vector<std::string> names, comm::CommunicatorPtr comm,
          ReducerOptions options);
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // While disabled (no_sync), backward only accumulates local gradients.
  void set_sync_enabled(bool enabled) { sync_enabled_ = enabled; }
  bool sync_enabled() const { return sync_enabled_; }

  // Installs how buckets are communicated (default: AllReduceHook); the hook is attached to this
  // reducer's buckets at once. Install it before the first backward.
  void set_comm_hook(std::shared_ptr<CommHook> hook);
  CommHook& comm_hook() const { return *hook_; }
  comm::Communicator& communicator() const { return *comm_; }
  // Runs when a synchronized backward begins (its first gradient is ready): the forward that produced
  // the loss is over, so DDP launches its buffer broadcast here and it overlaps the whole backward.
  void set_before_sync(std::function<void()> fn) { before_sync_ = std::move(fn); }
  // Runs at the end of every synchronized backward, after gradients are written (DDP waits for the
  // buffer broadcast here).
  void set_after_sync(std::function<void()> fn) { after_sync_ = std::move(fn); }
  // Runs once per bucket of a synchronized backward, in bucket order, as soon as that bucket's averaged
  // gradients are in its parameters' .grad: during backward when its collective finished before
  // backward did, else at its end (optim.in_backward steps the bucket's parameters here; Note [The
  // optimizer inside backward] in parallel/ddp/DdpStrategy.cpp). Without it, gradients are written at the end.
  void set_on_bucket_reduced(std::function<void(size_t bucket)> fn) { on_bucket_reduced_ = std::move(fn); }
  const std::vector<BucketSpec>& plan() const { return plan_; }
  const BackwardTrace& last_trace() const { return trace_; }

  // Whether a collective of a bucket after `b` in this backward is still under way or not yet launched:
  // work that stepping bucket b overlaps with. Never blocks.
  bool reducing_after(size_t b);

  // Called by the autograd hook of parameter `index` once its gradient is accumulated.
  void on_gradient_ready(size_t index);

 private:
  struct Bucket {
    GradBucket grad;  // the flat buffer, its per-parameter views and names, as the hook sees them
    size_t pending = 0;
    bool launched = false;
    comm::HandlePtr handle;
  };
  struct HookState;  // shared with the autograd hooks, which may outlive the reducer

  void read_skip_fault();
  void begin_backward();
  void mark_ready(size_t index);
  void launch_ready_buckets();
  void launch(size_t b);
  // Waits for bucket b (next_to_finish_), writes its average into the parameters' .grad and tells
  // on_bucket_reduced_.
  void finish(size_t b);
  // finish() for the launched buckets whose collectives are done, in order, without blocking.
  void finish_completed_buckets();
  void finalize();
  double since_start() const;

  std::vector<at::Tensor> params_;
  std::vector<std::string> names_;
  comm::CommunicatorPtr comm_;
  ReducerOptions options_;
  std::vector<BucketSpec> plan_;
  std::vector<Bucket> buckets_;
  std::vector<std::pair<size_t, size_t>> locator_;  // param -> (bucket, position in bucket)
  std::vector<bool> ready_;
  size_t next_to_launch_ = 0;
  size_t next_to_finish_ = 0;
  bool in_backward_ = false;
  bool sync_enabled_ = true;
  std::shared_ptr<CommHook> hook_;
  std::function<void()> before_sync_;
  std::function<void()> after_sync_;
  std::function<void(size_t)> on_bucket_reduced_;
  std::shared_ptr<HookState> hook_state_;
  std::vector<std::shared_ptr<void>> grad_accumulators_;
  std::chrono::steady_clock::time_point start_;
  BackwardTrace trace_;
  int64_t backwards_ = 0;  // synchronized backward passes begun
  // COHORT_FAULT_SKIP_BUCKET=STEP:BUCKET (comm/FaultInjection.h): on COHORT_FAULT_RANK, that backward's
  // bucket is not all-reduced. -1: none.
  int64_t skip_step_ = -1, skip_bucket_ = -1;
};

}  // namespace cohort::parallel::ddp

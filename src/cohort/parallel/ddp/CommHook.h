// How a gradient bucket is communicated: the one extension point for gradient compression. The default
// hook averages with an all-reduce; fp16/bf16 compression and PowerSGD (parallel/compress/) are other
// hooks, not other reducers.
//
//   class MyHook : public cohort::parallel::ddp::CommHook {
//     cohort::comm::HandlePtr run(cohort::comm::Communicator& comm, cohort::parallel::ddp::GradBucket& b) override;
//   };
//   ddp.set_comm_hook(std::make_shared<MyHook>());
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "cohort/comm/Communicator.h"
#include "cohort/util/OldNames.h"  // the names of the last release, for programs outside this tree

namespace cohort::parallel::ddp {

struct GradBucket {
  size_t index = 0;
  // The bucket's gradients, flattened; the hook leaves the averaged result in it by the time the
  // returned handle's wait() returns.
  at::Tensor buffer;
  // Views of `buffer` in the parameters' shapes, and the parameters' names, in bucket order: what a
  // hook that treats each gradient as a matrix (PowerSGD) or keys state by parameter needs.
  std::vector<at::Tensor> grads;
  std::vector<std::string> names;
  // Set by the hook: the bytes this rank puts into collectives for this bucket in this backward.
  int64_t wire_bytes = 0;
};

// Hook state for checkpoints, by name; see CommHook::state_dict.
using HookState = std::vector<std::pair<std::string, at::Tensor>>;

class CommHook {
 public:
  virtual ~CommHook() = default;
  virtual std::string name() const = 0;
  // Called once when the hook is installed, with every bucket the reducer will pass to run(): a hook
  // with per-bucket state plans it here, the same on every rank.
  virtual void attach(const std::vector<GradBucket>& buckets, comm::Communicator& comm) {}
  // Launches the bucket's communication and returns at once; the reducer waits on the handles in
  // bucket order after backward. Collectives must be issued in the same order on every rank.
  virtual comm::HandlePtr run(comm::Communicator& comm, GradBucket& bucket) = 0;
  // Whether the handle run() returns issues collectives of its own when waited for (PowerSGD's second
  // all-reduce). Such buckets are waited for only after backward, in bucket order on every rank.
  virtual bool wait_issues_collectives() const { return false; }
  // After every bucket of a synchronized backward has been waited for: one optimizer step is done.
  virtual void end_of_backward() {}
  // The state a resumed run needs to continue bit for bit. A collective: every rank calls it, at the
  // same point; per-rank state is gathered so that the rank that saves has all of it.
  virtual HookState state_dict(comm::Communicator& comm) { return {}; }
  virtual void load_state_dict(const HookState& state, comm::Communicator& comm) {}
};

// Note [Where gradients are divided by world size]
// The default hook divides each bucket by the world size *before* the sum, as c10d does: the sum of W
// already-averaged gradients never exceeds the range of one of them, which keeps low-precision
// compression hooks from overflowing. Every hook must leave the average, not the sum, in the buffer.
class AllReduceHook : public CommHook {
 public:
  std::string name() const override { return "allreduce"; }
  comm::HandlePtr run(comm::Communicator& comm, GradBucket& bucket) override;
};

}  // namespace cohort::parallel::ddp

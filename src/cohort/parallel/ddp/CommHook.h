// How a gradient bucket is communicated: the one extension point for gradient compression. The default
// hook averages with an all-reduce; fp16 compression and PowerSGD are other hooks, not other reducers.
//
//   class MyHook : public cohort::CommHook {
//     cohort::HandlePtr run(cohort::Communicator& comm, cohort::GradBucket& b) override { ... }
//   };
//   ddp.set_comm_hook(std::make_shared<MyHook>());
#pragma once

#include <memory>
#include <string>

#include <ATen/ATen.h>

#include "cohort/comm/Communicator.h"

namespace cohort {

struct GradBucket {
  size_t index;
  // The bucket's gradients, flattened; the hook leaves the averaged result in it by the time the
  // returned handle's wait() returns.
  at::Tensor buffer;
};

class CommHook {
 public:
  virtual ~CommHook() = default;
  virtual std::string name() const = 0;
  virtual HandlePtr run(Communicator& comm, GradBucket& bucket) = 0;
};

// Note [Where gradients are divided by world size]
// The default hook divides each bucket by the world size *before* the sum, as c10d does: the sum of W
// already-averaged gradients never exceeds the range of one of them, which keeps low-precision
// compression hooks from overflowing. Every hook must leave the average, not the sum, in the buffer.
class AllReduceHook : public CommHook {
 public:
  std::string name() const override { return "allreduce"; }
  HandlePtr run(Communicator& comm, GradBucket& bucket) override;
};

}  // namespace cohort

// Gradient compression by precision: each bucket is all-reduced in float16 or bfloat16 instead of
// float32, halving the bytes on the wire (PyTorch's fp16_compress_hook / bf16_compress_hook).
//
//   ddp.set_comm_hook(std::make_shared<cohort::parallel::compress::LowPrecisionHook>(at::kHalf));
//
// See Note [Where gradients are divided by world size]: the bucket is divided before it is cast, so
// the sum of W averaged fp16 gradients cannot overflow where one gradient did not.
#pragma once

#include <string>

#include <c10/core/ScalarType.h>

#include "cohort/parallel/ddp/CommHook.h"
#include "cohort/util/OldNames.h"  // the names of the last release, for programs outside this tree

namespace cohort::parallel::compress {

class LowPrecisionHook : public parallel::ddp::CommHook {
 public:
  // wire: at::kHalf or at::kBFloat16.
  explicit LowPrecisionHook(c10::ScalarType wire);
  std::string name() const override;
  comm::HandlePtr run(comm::Communicator& comm, parallel::ddp::GradBucket& bucket) override;

 private:
  c10::ScalarType wire_;
};

}  // namespace cohort::parallel::compress

#include "cohort/parallel/compress/LowPrecisionHook.h"

#include "cohort/util/Error.h"

namespace cohort::parallel::compress {

LowPrecisionHook::LowPrecisionHook(c10::ScalarType wire) : wire_(wire) {
  COHORT_ASSERT(wire == at::kHalf || wire == at::kBFloat16, "LowPrecisionHook sends float16 or bfloat16");
}

std::string LowPrecisionHook::name() const { return wire_ == at::kHalf ? "fp16" : "bf16"; }

comm::HandlePtr LowPrecisionHook::run(comm::Communicator& comm, parallel::ddp::GradBucket& bucket) {
  auto buffer = bucket.buffer;
  const std::string what = "gradient bucket " + std::to_string(bucket.index) + " (" + name() + ")";
  if (buffer.scalar_type() == wire_) {  // already low precision: nothing to compress
    buffer.div_(comm.size());
    bucket.wire_bytes = buffer.numel() * static_cast<int64_t>(buffer.element_size());
    return comm.all_reduce(buffer, comm::ReduceOp::kSum, what);
  }
  // See Note [Where gradients are divided by world size].
  auto wire = buffer.div(comm.size()).to(wire_);
  bucket.wire_bytes = wire.numel() * static_cast<int64_t>(wire.element_size());
  return comm::then(comm.all_reduce(wire, comm::ReduceOp::kSum, what),
                    [buffer, wire]() mutable { buffer.copy_(wire); });
}

}  // namespace cohort::parallel::compress

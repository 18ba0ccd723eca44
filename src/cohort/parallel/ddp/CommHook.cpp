#include "cohort/parallel/ddp/CommHook.h"

namespace cohort::parallel::ddp {

comm::HandlePtr AllReduceHook::run(comm::Communicator& comm, GradBucket& bucket) {
  // See Note [Where gradients are divided by world size].
  bucket.buffer.div_(comm.size());
  bucket.wire_bytes = bucket.buffer.numel() * static_cast<int64_t>(bucket.buffer.element_size());
  return comm.all_reduce(bucket.buffer, comm::ReduceOp::kSum, "gradient bucket " + std::to_string(bucket.index));
}

}  // namespace cohort::parallel::ddp

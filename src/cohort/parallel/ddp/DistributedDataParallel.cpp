#include "cohort/parallel/ddp/DistributedDataParallel.h"

#include "cohort/util/Error.h"

namespace cohort::parallel::ddp {

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<torch::nn::Module> module, comm::CommunicatorPtr comm,
                                                 DdpOptions options)
    : module_(std::move(module)), comm_(std::move(comm)), options_(options) {
  auto trainable = trainable_parameters(*module_, "ddp");
  check_replicas_match(trainable, *comm_, "ddp");
  names_ = trainable.names;
  broadcast_state();
  ReducerOptions ro;
  ro.bucket_cap_bytes = static_cast<int64_t>(options_.bucket_mb * (1 << 20));
  ro.first_bucket_cap_bytes = static_cast<int64_t>(options_.first_bucket_mb * (1 << 20));
  ro.last_bucket_cap_bytes = static_cast<int64_t>(options_.last_bucket_mb * (1 << 20));
  ro.overlap = options_.overlap;
  ro.find_unused_parameters = options_.find_unused_parameters;
  reducer_ = std::make_unique<Reducer>(std::move(trainable.params), names_, comm_, ro);
  if (options_.broadcast_buffers) {
    // The forward that updated the batch-norm statistics is over once backward begins, so their
    // broadcast is launched then and overlaps the whole backward; it is waited for at the end.
    reducer_->set_before_sync([this] { launch_buffer_broadcast(); });
    reducer_->set_after_sync([this] { pending_buffers_.finish(); });
  }
}

void DistributedDataParallel::broadcast_state() {
  std::vector<at::Tensor> all;
  for (const auto& p : module_->parameters(true)) all.push_back(p);
  for (const auto& b : module_->buffers(true)) all.push_back(b);
  broadcast_from_rank0(all, *comm_, "DDP initial parameters and buffers from rank 0");
}

void DistributedDataParallel::broadcast_buffers() {
  launch_buffer_broadcast();
  pending_buffers_.finish();
}

void DistributedDataParallel::launch_buffer_broadcast() {
  const auto buffers = module_->buffers(true);
  pending_buffers_.launch(std::vector<at::Tensor>(buffers.begin(), buffers.end()), *comm_, "DDP buffers from rank 0");
}

}  // namespace cohort::parallel::ddp

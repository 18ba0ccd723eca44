// Data parallelism for any torch::nn::Module: every rank holds a full replica, gradients are averaged
// across ranks during backward, bucket by bucket, so the optimizer steps identically everywhere.
//
//   auto net = std::make_shared<MyNet>();
//   cohort::parallel::ddp::DistributedDataParallel ddp(net, world.comm);  // checks replicas, takes rank 0's weights
//   for (auto& batch : my_shard) {
//     auto loss = torch::nn::functional::cross_entropy(net->forward(batch.data), batch.target);
//     opt.zero_grad(); loss.backward(); opt.step();           // gradients already averaged
//   }
//   { auto guard = ddp.no_sync(); loss.backward(); }          // accumulate locally, sync next time
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <torch/nn/module.h>

#include "cohort/comm/Communicator.h"
#include "cohort/parallel/Params.h"
#include "cohort/parallel/ddp/Reducer.h"
#include "cohort/util/OldNames.h"  // the names of the last release, for programs outside this tree

namespace cohort::parallel::ddp {

struct DdpOptions {
  double bucket_mb = 25.0;
  double first_bucket_mb = 1.0;
  double last_bucket_mb = 0.0;  // > 0: the last bucket holds the first parameters up to this (BucketPlan.h)
  bool overlap = true;
  bool find_unused_parameters = false;
  // Batch-norm running statistics follow rank 0 after every synchronized backward, as PyTorch's DDP
  // makes them follow rank 0 at every forward. The broadcast overlaps the backward.
  bool broadcast_buffers = true;
};

class DistributedDataParallel {
 public:
  DistributedDataParallel(std::shared_ptr<torch::nn::Module> module, comm::CommunicatorPtr comm,
                          DdpOptions options = {});

  // Scope guard: backward passes inside it accumulate gradients locally without communication.
  class NoSync {
   public:
    explicit NoSync(Reducer& r) : reducer_(&r), previous_(r.sync_enabled()) { r.set_sync_enabled(false); }
    NoSync(NoSync&& o) noexcept : reducer_(o.reducer_), previous_(o.previous_) { o.reducer_ = nullptr; }
    ~NoSync() {
      if (reducer_) reducer_->set_sync_enabled(previous_);
    }

   private:
    Reducer* reducer_;
    bool previous_;
  };
  NoSync no_sync() { return NoSync(*reducer_); }

  // Makes every rank's parameters and buffers equal to rank 0's.
  void broadcast_state();
  // Makes every rank's buffers (batch-norm statistics) equal to rank 0's.
  void broadcast_buffers();

  void set_comm_hook(std::shared_ptr<CommHook> hook) { reducer_->set_comm_hook(std::move(hook)); }
  const Reducer& reducer() const { return *reducer_; }
  Reducer& reducer() { return *reducer_; }
  torch::nn::Module& module() { return *module_; }
  const std::vector<std::string>& parameter_names() const { return names_; }

 private:
  void launch_buffer_broadcast();

  std::shared_ptr<torch::nn::Module> module_;
  comm::CommunicatorPtr comm_;
  DdpOptions options_;
  std::vector<std::string> names_;
  std::unique_ptr<Reducer> reducer_;
  FlatBroadcast pending_buffers_;
};

}  // namespace cohort::parallel::ddp

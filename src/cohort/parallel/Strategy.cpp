#include "cohort/parallel/Strategy.h"

#include "cohort/parallel/ddp/DistributedDataParallel.h"

namespace cohort {
namespace {

class DdpStrategy : public Strategy {
 public:
  DdpStrategy(std::shared_ptr<torch::nn::Module> model, CommunicatorPtr comm, DdpOptions opts)
      : ddp_(std::move(model), std::move(comm), opts) {}
  std::string name() const override { return "ddp"; }
  std::shared_ptr<void> gradient_sync(bool enabled) override {
    if (enabled) return nullptr;
    return std::make_shared<DistributedDataParallel::NoSync>(ddp_.no_sync());
  }
  int64_t last_sync_bytes() const override { return ddp_.reducer().last_trace().bytes_reduced; }

 private:
  DistributedDataParallel ddp_;
};

}  // namespace

std::unique_ptr<Strategy> make_strategy(const DistConfig& cfg, std::shared_ptr<torch::nn::Module> model,
                                        CommunicatorPtr comm) {
  DdpOptions opts;
  opts.bucket_mb = cfg.bucket_mb;
  opts.first_bucket_mb = cfg.first_bucket_mb;
  opts.overlap = cfg.overlap;
  opts.find_unused_parameters = cfg.find_unused_parameters;
  opts.broadcast_buffers = cfg.broadcast_buffers;
  return std::make_unique<DdpStrategy>(std::move(model), std::move(comm), opts);
}

}  // namespace cohort

#include "cohort/parallel/Strategy.h"

#include "cohort/parallel/compress/LowPrecisionHook.h"
#include "cohort/parallel/compress/PowerSgd.h"
#include "cohort/parallel/ddp/DistributedDataParallel.h"

namespace cohort {
namespace {

class DdpStrategy : public Strategy {
 public:
  DdpStrategy(std::shared_ptr<torch::nn::Module> model, CommunicatorPtr comm, DdpOptions opts,
              std::shared_ptr<CommHook> hook)
      : ddp_(std::move(model), std::move(comm), opts) {
    ddp_.set_comm_hook(std::move(hook));
  }
  std::string name() const override { return "ddp"; }
  std::shared_ptr<void> gradient_sync(bool enabled) override {
    if (enabled) return nullptr;
    return std::make_shared<DistributedDataParallel::NoSync>(ddp_.no_sync());
  }
  SyncBytes last_sync_bytes() const override {
    const auto& t = ddp_.reducer().last_trace();
    return {t.bytes_reduced, t.bytes_dense};
  }
  HookState state_dict() override {
    return ddp_.reducer().comm_hook().state_dict(ddp_.reducer().communicator());
  }
  void load_state_dict(const HookState& state) override {
    ddp_.reducer().comm_hook().load_state_dict(state, ddp_.reducer().communicator());
  }

 private:
  DistributedDataParallel ddp_;
};

}  // namespace

std::shared_ptr<CommHook> make_comm_hook(const TrainConfig& cfg) {
  const auto& c = cfg.dist.compress;
  if (c == "fp16") return std::make_shared<LowPrecisionHook>(at::kHalf);
  if (c == "bf16") return std::make_shared<LowPrecisionHook>(at::kBFloat16);
  if (c == "powersgd") {
    PowerSgdOptions o;
    o.rank = cfg.powersgd.rank;
    o.start_iter = cfg.powersgd.start_iter;
    o.min_compression_rate = cfg.powersgd.min_compression_rate;
    o.error_feedback = cfg.powersgd.error_feedback;
    o.warm_start = cfg.powersgd.warm_start;
    o.seed = cfg.train.seed;
    return std::make_shared<PowerSgdHook>(o);
  }
  return std::make_shared<AllReduceHook>();
}

std::unique_ptr<Strategy> make_strategy(const TrainConfig& cfg, std::shared_ptr<torch::nn::Module> model,
                                        CommunicatorPtr comm) {
  DdpOptions opts;
  opts.bucket_mb = cfg.dist.bucket_mb;
  opts.first_bucket_mb = cfg.dist.first_bucket_mb;
  opts.overlap = cfg.dist.overlap;
  opts.find_unused_parameters = cfg.dist.find_unused_parameters;
  opts.broadcast_buffers = cfg.dist.broadcast_buffers;
  return std::make_unique<DdpStrategy>(std::move(model), std::move(comm), opts, make_comm_hook(cfg));
}

}  // namespace cohort

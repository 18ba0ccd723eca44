#include "cohort/train/StrategyFactory.h"

#include "cohort/parallel/compress/LowPrecisionHook.h"
#include "cohort/parallel/compress/PowerSgd.h"
#include "cohort/parallel/ddp/DdpStrategy.h"
#include "cohort/parallel/shard/ShardedStrategy.h"
#include "cohort/util/Error.h"
#if COHORT_HAVE_SWARM
#include "cohort/parallel/swarm/DilocoStrategy.h"
#include "cohort/parallel/swarm/SwarmStrategy.h"
#endif

namespace cohort::train {
namespace {

std::unique_ptr<parallel::Strategy> make_ddp(const TrainConfig& cfg, std::shared_ptr<torch::nn::Module> model,
                                             comm::CommunicatorPtr comm) {
  parallel::ddp::DdpOptions opts;
  opts.bucket_mb = cfg.dist.bucket_mb;
  opts.first_bucket_mb = cfg.dist.first_bucket_mb;
  // In backward, the last bucket's step is the one nothing hides: by default as small as the first.
  opts.last_bucket_mb = cfg.dist.last_bucket_mb > 0 ? cfg.dist.last_bucket_mb
                        : cfg.optim.in_backward     ? cfg.dist.first_bucket_mb
                                                    : 0.0;
  opts.overlap = cfg.dist.overlap;
  opts.find_unused_parameters = cfg.dist.find_unused_parameters;
  opts.broadcast_buffers = cfg.dist.broadcast_buffers;
  return parallel::ddp::make_ddp_strategy(std::move(model), std::move(comm), opts, make_comm_hook(cfg));
}

}  // namespace

std::shared_ptr<parallel::ddp::CommHook> make_comm_hook(const TrainConfig& cfg) {
  const auto& c = cfg.dist.compress;
  if (c == "fp16") return std::make_shared<parallel::compress::LowPrecisionHook>(at::kHalf);
  if (c == "bf16") return std::make_shared<parallel::compress::LowPrecisionHook>(at::kBFloat16);
  if (c == "powersgd") {
    parallel::compress::PowerSgdOptions o;
    o.rank = cfg.powersgd.rank;
    o.start_iter = cfg.powersgd.start_iter;
    o.min_compression_rate = cfg.powersgd.min_compression_rate;
    o.error_feedback = cfg.powersgd.error_feedback;
    o.warm_start = cfg.powersgd.warm_start;
    o.seed = cfg.train.seed;
    return std::make_shared<parallel::compress::PowerSgdHook>(o);
  }
  return std::make_shared<parallel::ddp::AllReduceHook>();
}

parallel::StrategyTraits strategy_traits(const TrainConfig& cfg, int rank, int world_size) {
  parallel::StrategyTraits t;
  const StrategyKind kind = cfg.dist.kind();
  t.data_parts = world_size;
  t.data_part = rank;
  t.data_seed = cfg.train.seed;
  // One Gloo collective at a time under ddp's optim.in_backward, so each bucket's step overlaps the next
  // one's transfer. Not for the sharded strategies: their gathers at the step then queue one behind
  // another (Note [Sharded steps inside backward]).
  t.one_collective_at_a_time = cfg.optim.in_backward && kind == StrategyKind::kDdp;
  if (!is_decentralized(kind)) return t;
  // A swarm (or diloco) peer's workers are its ranks. With swarm.sampler=partition: the peer's shard of
  // swarm.partitions, as ddp's ranks would have it. With swarm.sampler=random: the whole set under the
  // peer's own seed (train.seed and its swarm.listen address), for the swarm drawn pass after pass, for
  // diloco epoch by epoch (each peer's epoch is then a pass over the whole set).
  t.leaves_alone = t.groups_runs = true;
  if (cfg.swarm.sampler == "partition") {
    t.data_parts = static_cast<int>(cfg.swarm.partitions) * world_size;
    t.data_part = static_cast<int>(cfg.swarm.partition) * world_size + rank;
    return t;
  }
  t.data_seed = cfg.train.seed ^ std::hash<std::string>{}(cfg.swarm.listen);
  if (kind == StrategyKind::kSwarm)
    t.endless_step_samples =
        cfg.swarm.target_batch_size > 0 ? cfg.swarm.target_batch_size : cfg.data.batch_size * world_size;
  return t;
}

std::unique_ptr<parallel::Strategy> make_strategy(const TrainConfig& cfg, std::shared_ptr<torch::nn::Module> model,
                                                  comm::CommunicatorPtr comm) {
  const StrategyKind kind = cfg.dist.kind();
  if (is_decentralized(kind)) {
#if COHORT_HAVE_SWARM
    // Inside a peer its workers are a ddp job; the swarm and DiLoCo are between peers.
    auto inner = make_ddp(cfg, model, comm);
    if (kind == StrategyKind::kDiloco)
      return parallel::swarm::make_diloco_strategy(cfg, std::move(model), std::move(comm), std::move(inner));
    return parallel::swarm::make_swarm_strategy(cfg, std::move(model), std::move(comm), std::move(inner));
#else
    throw ConfigError("dist.strategy=" + cfg.dist.strategy +
                          " is not built into this cohort: OpenDHT (libopendht-dev) was not found "
                          "when it was compiled (Debian 13 has no OpenDHT package)",
                      "build cohort where libopendht-dev is installed (Debian 12), or use dist.strategy=ddp");
#endif
  }
  if (is_sharded(kind)) {
    parallel::shard::ShardedOptions o;
    o.stage = kind == StrategyKind::kZero1   ? parallel::shard::ShardStage::kZero1
              : kind == StrategyKind::kZero2 ? parallel::shard::ShardStage::kZero2
                                             : parallel::shard::ShardStage::kFsdp;
    o.bucket_mb = cfg.dist.bucket_mb;
    o.fsdp_unit = cfg.dist.fsdp_unit;
    o.broadcast_buffers = cfg.dist.broadcast_buffers;
    o.in_backward = cfg.optim.in_backward;
    return parallel::shard::make_sharded_strategy(std::move(model), std::move(comm), o);
  }
  return make_ddp(cfg, std::move(model), std::move(comm));
}

}  // namespace cohort::train

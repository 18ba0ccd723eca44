// What combinations of keys cohort refuses, and why: validate(), run on every loaded config after each
// key's own check (Config.cpp's fields()). Each refusal names the keys and what to set instead.
#include <string>
#include <utility>

#include "cohort/config/Config.h"
#include "cohort/util/Error.h"

namespace cohort::config {

namespace {

// The swarm's own constraints: what it does not combine with, and its partition.
void validate_swarm(const TrainConfig& cfg) {
  if (!is_decentralized(cfg.dist.kind())) return;
  const auto& s = cfg.swarm;
  if (cfg.amp.precision == "fp16" || cfg.amp.precision == "fp16-master")
    throw ConfigError("dist.strategy=" + cfg.dist.strategy + " does not take amp.precision=" + cfg.amp.precision +
                          " (its loss scale would have to agree across peers)",
                      "use amp.precision=bf16 or fp32 with the swarm");
  if (cfg.dist.kind() == StrategyKind::kSwarm && s.sampler == "random" && cfg.train.grad_accum_steps != 1)
    throw ConfigError(
        "dist.strategy=swarm accumulates batches itself up to swarm.target_batch_size; "
        "train.grad_accum_steps is " +
            std::to_string(cfg.train.grad_accum_steps),
        "set train.grad_accum_steps=1 and choose swarm.target_batch_size");
  if (s.group_size > 0 && s.min_group_size > s.group_size)
    throw ConfigError("swarm.min_group_size=" + std::to_string(s.min_group_size) +
                          " is above swarm.group_size=" + std::to_string(s.group_size) + ": no group could ever form",
                      "lower swarm.min_group_size, or raise swarm.group_size (0: every ready peer)");
  if (s.partition >= s.partitions)
    throw ConfigError("swarm.partition=" + std::to_string(s.partition) +
                          " is not below swarm.partitions=" + std::to_string(s.partitions),
                      "number the peers 0 .. swarm.partitions - 1");
  if (s.sampler == "partition" && s.target_batch_size != 0 &&
      s.target_batch_size != cfg.data.batch_size * cfg.train.grad_accum_steps * s.partitions)
    throw ConfigError(
        "swarm.sampler=partition takes one batch per peer per step, so swarm.target_batch_size must "
        "be data.batch_size x train.grad_accum_steps x swarm.partitions = " +
            std::to_string(cfg.data.batch_size * cfg.train.grad_accum_steps * s.partitions) + ", got " +
            std::to_string(s.target_batch_size),
        "leave swarm.target_batch_size at 0 with swarm.sampler=partition");
}

// What the optimizer inside backward cannot combine with: Note [The optimizer inside backward] in
// parallel/ddp/DdpStrategy.cpp.
void validate_in_backward(const TrainConfig& cfg) {
  if (!cfg.optim.in_backward) return;
  const auto& strategy = cfg.dist.strategy;
  if (is_decentralized(cfg.dist.kind()))
    throw ConfigError("optim.in_backward=true steps each gradient bucket as its all-reduce ends; dist.strategy=" +
                          strategy + " steps on the swarm's schedule, after its peers average",
                      "set optim.in_backward=false with dist.strategy=" + strategy);
  if (cfg.optim.clip_grad_norm > 0)
    throw ConfigError(
        "optim.clip_grad_norm needs the norm of every gradient before any parameter moves, and "
        "optim.in_backward=true steps the first buckets before the last gradients exist",
        "set optim.clip_grad_norm=0, or optim.in_backward=false");
  if (cfg.amp.precision == "fp16" || cfg.amp.precision == "fp16-master")
    throw ConfigError("amp.precision=" + cfg.amp.precision +
                          " scales the loss, and an overflow in any gradient must skip the whole step; "
                          "optim.in_backward=true moves the first buckets' parameters before the last gradients exist",
                      "use amp.precision=bf16 or fp32 with optim.in_backward=true, or optim.in_backward=false");
}

}  // namespace

std::pair<int64_t, int64_t> trace_step_range(const std::string& steps) {
  if (steps.empty()) return {0, 0};
  const auto colon = steps.find(':');
  const auto number = [](const std::string& t) -> int64_t {
    if (t.empty() || t.size() > 12 || t.find_first_not_of("0123456789") != std::string::npos) return -1;
    return std::stoll(t);
  };
  const int64_t first = colon == std::string::npos ? -1 : number(steps.substr(0, colon));
  const int64_t last = colon == std::string::npos ? -1 : number(steps.substr(colon + 1));
  if (first < 1 || last < first)
    throw ConfigError("log.trace_steps=" + steps + " is not a range of steps A:B with 1 <= A <= B",
                      "trace a few steps, e.g. log.trace_steps=20:22 (every rank writes each collective and phase "
                      "of them)");
  return {first, last};
}

void validate(const TrainConfig& cfg) {
  trace_step_range(cfg.log.trace_steps);
  validate_in_backward(cfg);
  validate_swarm(cfg);
  if (cfg.train.whiten_bias_epochs > 0 && cfg.model.name != "airbench")
    throw ConfigError(
        "train.whiten_bias_epochs applies to model.name=airbench (its whitening layer), not " + cfg.model.name,
        "remove train.whiten_bias_epochs, or set model.name=airbench");
  if (cfg.dist.kind() != StrategyKind::kDdp && cfg.dist.compress != "none")
    throw ConfigError(
        "dist.compress=" + cfg.dist.compress + " works with dist.strategy=ddp only, not " + cfg.dist.strategy,
        "set dist.compress=none, or dist.strategy=ddp");
  if (cfg.data.device_resident && cfg.data.name == "imagefolder")
    throw ConfigError(
        "data.device_resident keeps an in-memory dataset on the device; data.name=imagefolder is "
        "decoded from JPEG files batch by batch",
        "remove data.device_resident, or use fashion-mnist, mnist or cifar10");
  // The lookahead average writes the weights directly; sharded strategies update their master slices
  // and would overwrite it at the next step.
  if (cfg.dist.kind() != StrategyKind::kDdp && cfg.train.lookahead)
    throw ConfigError("train.lookahead works with dist.strategy=ddp only, not " + cfg.dist.strategy,
                      "use dist.strategy=ddp with train.lookahead (airbench's model is small enough to replicate)");
  if (cfg.amp.precision == "fp16-master" && cfg.train.lookahead)
    throw ConfigError("train.lookahead averages the model's own weights, which amp.precision=fp16-master keeps in fp16",
                      "use amp.precision=fp16 with train.lookahead");
  // As torch.cuda.amp.GradScaler: a growth that does not grow or a backoff that does not shrink (or
  // zeroes the scale) would turn an overflow into a skip on every step.
  if (cfg.amp.growth_factor <= 1.0)
    throw ConfigError("config key 'amp.growth_factor' must be > 1, got " + std::to_string(cfg.amp.growth_factor),
                      "the loss scale grows by this factor; the default is 2");
  if (cfg.amp.backoff_factor <= 0.0 || cfg.amp.backoff_factor >= 1.0)
    throw ConfigError("config key 'amp.backoff_factor' must be between 0 and 1 (exclusive), got " +
                          std::to_string(cfg.amp.backoff_factor),
                      "the loss scale shrinks by this factor after an overflow; the default is 0.5");
  if (cfg.dist.first_bucket_mb > cfg.dist.bucket_mb)
    throw ConfigError("config key 'dist.first_bucket_mb' (" + std::to_string(cfg.dist.first_bucket_mb) +
                          ") is larger than dist.bucket_mb (" + std::to_string(cfg.dist.bucket_mb) + ")",
                      "make the first bucket smaller than the others");
  if (cfg.sched.name == "onecycle" && cfg.sched.cycle_momentum && cfg.sched.base_momentum > cfg.sched.max_momentum)
    throw ConfigError("sched.base_momentum (" + std::to_string(cfg.sched.base_momentum) +
                          ") is above sched.max_momentum (" + std::to_string(cfg.sched.max_momentum) + ")",
                      "set sched.base_momentum <= sched.max_momentum, or sched.cycle_momentum=false");
  if (cfg.sched.name == "onecycle" && cfg.sched.warmup_epochs > 0)
    throw ConfigError("config key 'sched.warmup_epochs' does not apply to sched.name=onecycle",
                      "onecycle warms up over sched.pct_start of training; set that instead");
  if (cfg.eval.tta > 2)
    throw ConfigError("config key 'eval.tta' must be 0, 1 or 2, got " + std::to_string(cfg.eval.tta),
                      "eval.tta=2 is airbench's multi-view test-time augmentation");
  if (!cfg.ckpt.upload.empty() &&
      (cfg.ckpt.upload.rfind("s3://", 0) != 0 || cfg.ckpt.upload.size() <= 5 || cfg.ckpt.upload[5] == '/'))
    throw ConfigError("config key 'ckpt.upload' must be s3://bucket[/prefix], got '" + cfg.ckpt.upload + "'",
                      "for example ckpt.upload=s3://my-bucket/cohort-runs");
  const auto& m = cfg.log.mlflow;
  const bool http = m.rfind("http://", 0) == 0 || m.rfind("https://", 0) == 0;
  if (!m.empty() && (!http || m.find("://") + 3 == m.size()))
    throw ConfigError("config key 'log.mlflow' must be an MLflow server's http://HOST:PORT, got '" + m + "'",
                      "for example log.mlflow=http://127.0.0.1:5000 (`mlflow server` prints it); a file store "
                      "or databricks:// URI is not supported");
}

}  // namespace cohort::config

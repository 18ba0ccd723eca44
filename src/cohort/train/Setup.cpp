#include "cohort/train/Setup.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <iostream>
#include <thread>

#include <torch/torch.h>

#include "cohort/checkpoint/Names.h"
#include "cohort/checkpoint/ShardedCheckpoint.h"
#include "cohort/checkpoint/Steps.h"
#include "cohort/comm/FlightRecorder.h"
#include "cohort/train/Device.h"
#include "cohort/train/InitialWeights.h"
#include "cohort/train/RankAgreement.h"
#include "cohort/train/Trainer.h"
#include "cohort/util/Error.h"

namespace cohort::train {
namespace fs = std::filesystem;

int worker_threads(const TrainConfig& cfg, const comm::WorldInfo& info) {
  if (cfg.train.threads > 0) return static_cast<int>(cfg.train.threads);
  if (const char* omp = std::getenv("OMP_NUM_THREADS"); omp && std::atoi(omp) > 0) return std::atoi(omp);
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, cores / std::max(1, info.local_world_size));
}

comm::World join_world(const TrainConfig& cfg, const comm::WorldInfo& info) {
  at::set_num_threads(worker_threads(cfg, info));
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(cfg.dist.timeout_s * 1000));
  const bool one_at_a_time = strategy_traits(cfg, info.rank, info.world_size).one_collective_at_a_time;
  comm::World world = comm::rendezvous(info, cfg.dist.backend, timeout, one_at_a_time ? 1 : 2);
  const char* torch_debug = std::getenv("TORCH_DISTRIBUTED_DEBUG");
  if (cfg.dist.debug == "detail" || (torch_debug && std::string(torch_debug) == "DETAIL")) world.comm->set_debug(true);
  if (auto flight = world.comm->flight()) flight->resize(static_cast<size_t>(cfg.dist.flight_records));
  return world;
}

int64_t prefetch_batches(const TrainConfig& cfg) { return cfg.data.name == "imagefolder" ? cfg.data.prefetch : 0; }

std::string launcher_run_dir(const comm::WorldInfo& info) {
  if ((info.launcher != "torchrun" && info.launcher != "slurm") || info.run_id.empty() || info.run_id == "none")
    return {};
  // The id may be the user's (--rdzv-id): keep it a single path component.
  std::string name = info.run_id;
  for (char& c : name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') c = '_';
  return "runs/" + info.launcher + "-" + name;
}

Resume find_resume(TrainConfig& cfg, const comm::WorldInfo& info, comm::World& world) {
  // A restart starts the workers with the same command line, so without run.dir each attempt would stamp
  // a directory of its own and never find the last attempt's checkpoints.
  if (cfg.run.dir.empty()) cfg.run.dir = launcher_run_dir(info);
  if (cfg.run.dir.empty() && info.max_restarts > 0 && info.restart_count == 0 && info.rank == 0)
    std::cerr << "cohort: warning: torchrun may restart the workers (--max-restarts " << info.max_restarts
              << "), but its rendezvous id is '" << info.run_id
              << "', shared by every job started without one, so a restart would start over: pass --rdzv-id "
                 "(or --standalone), or run.dir=DIR"
              << std::endl;
  if (info.restart_count > 0 && cfg.train.resume.empty() && !cfg.run.dir.empty()) {
    const auto ck = fs::path(cfg.run.dir) / checkpoint::names::kCheckpointsDir;
    const bool have = checkpoint::has_resumable(ck);
    if (have) cfg.train.resume = cfg.run.dir;
    if (info.rank == 0)
      std::cout << "cohort: restart " << info.restart_count << ": "
                << (have ? "resuming from " + ck.string() : std::string("no checkpoint yet; starting over"))
                << std::endl;
  }
  Resume resume;
  if (cfg.train.resume.empty()) return resume;
  const fs::path resume_dir = checkpoint::resolve_resume_dir(cfg.train.resume);
  // Rank 0 picks the save to resume from (see decided_by_rank0): every rank must start from the same step.
  resume.from = decided_by_rank0(world, "cohort/resume_from", [&] {
    auto found = checkpoint::load_latest(resume_dir);
    // A save cut off by a crash, or a file damaged since, is named and passed over for an older one.
    for (const auto& why : found.skipped) std::cerr << "cohort: warning: skipping checkpoint " << why << std::endl;
    resume.checkpoint = std::move(found.checkpoint);
    return found.dir.string();
  });
  if (info.rank != 0) resume.checkpoint = checkpoint::load_any(resume.from, checkpoint::names::kLast);
  if (cfg.run.dir.empty()) cfg.run.dir = resume_dir.parent_path().string();
  return resume;
}

Job set_up_job(TrainConfig& cfg, const comm::WorldInfo& info, comm::World& world, const Resume& resume) {
  Job job;
  const bool lead = info.rank == 0;
  job.device = training_device(cfg.train.device, info.local_rank);
  // See Note [What auto picks]: from here on cfg holds rank 0's precision and layout, and so do
  // config.json and every checkpoint.
  job.chosen = agree_auto_settings(cfg, job.device, world, resume.active() ? resume.checkpoint.state.config_json : "");
  job.nhwc = channels_last(cfg);
  job.data = data::open_datasets(cfg, info.rank, info.local_world_size, /*need_train=*/true, job.device);
  torch::manual_seed(cfg.train.seed);
  job.model = models::build(cfg.model, job.data.train->channels(), job.data.train->image_size());
  initial_weights(*job.model, cfg, *job.data.train, resume.active() ? &resume.checkpoint.model : nullptr,
                  (resume.from / checkpoint::names::weights_file(checkpoint::names::kLast)).string(), lead);
  // Device and precision before wrapping, so the strategy's buckets and masters take the final dtypes.
  // See Note [The mixed-precision dtype contract] in amp/MixedPrecision.h.
  configure_device(job.device, cfg.train.cudnn_benchmark);
  job.precision = std::make_unique<amp::MixedPrecision>(cfg.amp, job.device, lead);
  job.model->to(job.device);
  if (job.nhwc) to_channels_last(*job.model);
  job.precision->prepare_model(*job.model);
  // Wrapping checks that every rank built the same model and makes rank 0's weights everyone's.
  job.strategy = make_strategy(cfg, job.model, world.comm);
  job.strategy->build_optimizer(cfg.optim);
  // The lookahead average starts from the weights the strategy made every rank's.
  if (cfg.train.lookahead) job.lookahead = std::make_unique<optim::Ema>(*job.model, 0.95);
  return job;
}

data::DistributedSampler training_sampler(const TrainConfig& cfg, int64_t dataset_size, const comm::WorldInfo& info) {
  const auto t = strategy_traits(cfg, info.rank, info.world_size);
  const bool shuffle = true, drop_last = false;
  return {dataset_size, t.data_parts, t.data_part, shuffle, t.data_seed, drop_last};
}

namespace {

// Steps per epoch and the global batch. An endless stream's step is its samples from all processes
// together, however they split them (the swarm's swarm.target_batch_size); otherwise a step is a batch of
// every rank (sampler.world_size(): the ranks, or in a swarm partition every peer's ranks).
std::pair<int64_t, int64_t> step_shape(const TrainConfig& cfg, const data::DistributedSampler& sampler,
                                       const comm::WorldInfo& info) {
  const int64_t batch = cfg.data.batch_size, accum = cfg.train.grad_accum_steps;
  if (const int64_t target = strategy_traits(cfg, info.rank, info.world_size).endless_step_samples) {
    if (sampler.dataset_size() < target)
      throw ConfigError("swarm.target_batch_size=" + std::to_string(target) + " exceeds the " +
                            std::to_string(sampler.dataset_size()) + " training images",
                        "lower swarm.target_batch_size");
    return {sampler.dataset_size() / target, target};
  }
  const int64_t steps_per_epoch = sampler.num_samples() / (batch * accum);
  if (steps_per_epoch == 0)
    throw ConfigError("rank " + std::to_string(info.rank) +
                          ": data.batch_size x train.grad_accum_steps = " + std::to_string(batch * accum) +
                          " exceeds this rank's " + std::to_string(sampler.num_samples()) + " training images",
                      "lower data.batch_size, or use fewer workers");
  return {steps_per_epoch, batch * accum * sampler.world_size()};
}

}  // namespace

Plan make_plan(const TrainConfig& cfg, const data::DistributedSampler& sampler, const comm::WorldInfo& info) {
  const auto [steps_per_epoch, global_batch] = step_shape(cfg, sampler, info);
  // train.epochs=2.6 ends the third pass at 60% of its steps: the schedule spans the steps the run makes.
  const int64_t total_steps =
      std::max<int64_t>(1, static_cast<int64_t>(std::llround(cfg.train.epochs * static_cast<double>(steps_per_epoch))));
  const double peak_lr = cfg.optim.lr * (cfg.optim.scale_lr ? double(global_batch) / cfg.optim.base_batch : 1.0);
  const int64_t stop_step = cfg.train.max_steps > 0 ? std::min(total_steps, cfg.train.max_steps) : total_steps;
  return {cfg.data.batch_size,
          cfg.train.grad_accum_steps,
          steps_per_epoch,
          total_steps,
          stop_step,
          global_batch,
          optim::Schedule(cfg.sched, peak_lr, total_steps, steps_per_epoch)};
}

Batches::Batches(const TrainConfig& cfg, data::Source& train, const data::DistributedSampler& sampler, const Plan& plan,
                 bool endless, bool pin)
    : cfg_(cfg), train_(train), sampler_(sampler), plan_(plan), endless_(endless), pin_(pin) {}

data::AugmentOptions Batches::augment(int64_t pass) const {
  return {cfg_.data.augment, cfg_.data.crop_padding, true, cfg_.train.seed, pass, cfg_.data.flip == "alternating"};
}

void Batches::start_epoch(int64_t epoch, int64_t first_step, int64_t steps) {
  if (endless_) return;
  epoch_.emplace(train_,
                 batches_of(sampler_.indices(epoch), plan_.batch, first_step * plan_.accum, steps * plan_.accum),
                 augment(epoch), prefetch_batches(cfg_), pin_);
}

data::Batch Batches::next() {
  if (!endless_) return *epoch_->next();
  for (;;) {
    if (stream_)
      if (auto b = stream_->next()) return std::move(*b);
    const auto order = sampler_.indices(stream_pass_);
    const int64_t batches = static_cast<int64_t>(order.size()) / plan_.batch;
    stream_ = std::make_unique<data::Loader>(train_, batches_of(order, plan_.batch, 0, batches), augment(stream_pass_),
                                             prefetch_batches(cfg_), pin_);
    ++stream_pass_;
  }
}

}  // namespace cohort::train

#include "cohort/train/Trainer.h"

#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <thread>

#include <torch/torch.h>

#include "cohort/amp/MasterWeights.h"
#include "cohort/amp/MixedPrecision.h"
#include "cohort/checkpoint/Checkpoint.h"
#include "cohort/comm/Rendezvous.h"
#include "cohort/data/Batch.h"
#include "cohort/data/Datasets.h"
#include "cohort/data/DistributedSampler.h"
#include "cohort/log/ResourceMonitor.h"
#include "cohort/log/TensorBoard.h"
#include "cohort/models/Models.h"
#include "cohort/optim/Ema.h"
#include "cohort/optim/Schedule.h"
#include "cohort/checkpoint/Sharded.h"
#include "cohort/checkpoint/Steps.h"
#include "cohort/parallel/Strategy.h"
#include "cohort/train/AutoSettings.h"
#include "cohort/train/CheckpointUpload.h"
#include "cohort/train/Device.h"
#include "cohort/train/Evaluate.h"
#include "cohort/train/FaultInjection.h"
#include "cohort/train/InitialWeights.h"
#include "cohort/train/Metrics.h"
#include "cohort/train/PhaseClock.h"
#include "cohort/train/RankAgreement.h"
#include "cohort/train/Progress.h"
#include "cohort/util/AtomicFile.h"
#include "cohort/util/Error.h"
#include "cohort/util/Memory.h"

namespace cohort::train {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

// Note [Strategy state in the training-state file]
// What a strategy needs to resume exactly (PowerSGD's residuals and Q) travels in the training-state
// file beside the optimizer's buffers, each name prefixed with "strategy." so the two split apart on load.
const std::string kStrategyPrefix = "strategy.";
const std::string kLookaheadPrefix = "lookahead.";

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string percent(double v) {
  if (v < 0) return "n/a";
  std::ostringstream os;
  os << std::fixed << std::setprecision(2) << 100.0 * v << "%";
  return os.str();
}

// Note [Resource samples reach rank 0 at log intervals]
// Every rank's monitor thread writes its own resources.rank<R>.jsonl at log.monitor_s; rank 0 alone
// writes metrics.jsonl and TensorBoard, so the latest sample of every rank travels to it in the same
// place the training metrics are reduced: a collective every rank reaches at the same step.
constexpr int kResourceFields = 5;  // rss, peak rss, cpu %, gpu util % (-1: none), gpu memory used

std::vector<double> gather_resources(log::ResourceMonitor& monitor, Communicator& comm, int world_size) {
  const auto s = monitor.sample_now(/*record=*/false);
  auto mine = at::tensor({double(s.rss), double(s.peak_rss), s.cpu_percent, s.gpu ? s.gpu->util_percent : -1.0,
                          s.gpu ? double(s.gpu->memory_used) : 0.0},
                         at::kDouble);
  auto all = at::zeros({world_size * kResourceFields}, at::kDouble);
  comm.all_gather(all, mine, "resource samples")->wait();
  return std::vector<double>(all.data_ptr<double>(), all.data_ptr<double>() + all.numel());
}

}  // namespace

int worker_threads(const TrainConfig& cfg, const WorldInfo& info) {
  if (cfg.train.threads > 0) return static_cast<int>(cfg.train.threads);
  if (const char* omp = std::getenv("OMP_NUM_THREADS"); omp && std::atoi(omp) > 0) return std::atoi(omp);
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, cores / std::max(1, info.local_world_size));
}

TrainResult run_worker(TrainConfig cfg, const WorldInfo& info) {
  // Threads first: N workers on one machine must not each start a thread per core (torchrun sets
  // OMP_NUM_THREADS=1 for the same reason).
  at::set_num_threads(worker_threads(cfg, info));
  if (cfg.train.retain_memory) util::retain_freed_memory();
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(cfg.dist.timeout_s * 1000));
  World world = rendezvous(info, cfg.dist.backend, timeout);
  Communicator& comm = *world.comm;
  const char* torch_debug = std::getenv("TORCH_DISTRIBUTED_DEBUG");
  if (cfg.dist.debug == "detail" || (torch_debug && std::string(torch_debug) == "DETAIL")) comm.set_debug(true);
  const int rank = info.rank;
  const int world_size = info.world_size;
  const bool lead = rank == 0;

  // A restarted attempt (--max-restarts) resumes from the run's last checkpoint, if the failed attempt
  // got as far as saving one; otherwise it starts over.
  if (info.restart_count > 0 && cfg.train.resume.empty() && !cfg.run.dir.empty()) {
    const auto ck = fs::path(cfg.run.dir) / "checkpoints";
    const bool have = checkpoint::has_resumable(ck);
    if (have) cfg.train.resume = cfg.run.dir;
    if (info.rank == 0)
      std::cout << "cohort: restart " << info.restart_count << ": "
                << (have ? "resuming from " + ck.string() : std::string("no checkpoint yet; starting over")) << std::endl;
  }
  // Resume: the model, optimizer, step and best accuracy come from the checkpoint; sampling and
  // augmentation are pure functions of (seed, epoch, index), so they need no saved state.
  checkpoint::Checkpoint resume;
  const bool resuming = !cfg.train.resume.empty();
  fs::path resume_dir, resume_from;
  if (resuming) {
    resume_dir = checkpoint::resolve_resume_dir(cfg.train.resume);
    // Rank 0 picks the save to resume from (see decided_by_rank0): every rank must start from the same step.
    resume_from = decided_by_rank0(world, "cohort/resume_from", [&] {
      auto found = checkpoint::load_latest(resume_dir);
      // A save cut off by a crash, or a file damaged since, is named and passed over for an older one.
      for (const auto& why : found.skipped) std::cerr << "cohort: warning: skipping checkpoint " << why << std::endl;
      resume = std::move(found.checkpoint);
      return found.dir.string();
    });
    if (!lead) resume = checkpoint::load_any(resume_from, "last");
    if (cfg.run.dir.empty()) cfg.run.dir = resume_dir.parent_path().string();
  }
  check_same_config(config::to_json(cfg), world);
  const fs::path run_dir = agree_run_dir(cfg, world);
  log::ResourceMonitor monitor(cfg.log.monitor_s, run_dir / ("resources.rank" + std::to_string(rank) + ".jsonl"),
                               info.local_rank);

  const c10::Device device = training_device(cfg.train.device, info.local_rank);
  // See Note [What auto picks]: from here on cfg holds rank 0's precision and layout, and so do
  // config.json and every checkpoint.
  const AutoSettings chosen = agree_auto_settings(cfg, device, world, resuming ? resume.state.config_json : "");
  const bool nhwc = channels_last(cfg);
  auto data = data::open_datasets(cfg, rank, info.local_world_size, /*need_train=*/true, device);
  torch::manual_seed(cfg.train.seed);
  auto model = models::build(cfg.model, data.train->channels(), data.train->image_size());
  initial_weights(*model, cfg, *data.train, resuming ? &resume.model : nullptr,
                  (resume_from / "last.safetensors").string(), lead);
  // Device and precision before wrapping, so the strategy's buckets and masters take the final dtypes.
  // See Note [The mixed-precision dtype contract] in amp/MixedPrecision.h.
  configure_device(device, cfg.train.cudnn_benchmark);
  amp::MixedPrecision precision(cfg.amp, device, lead);
  model->to(device);
  if (nhwc) to_channels_last(*model);
  precision.prepare_model(*model);
  const EvalPlacement placement{device, nhwc, &precision};

  // Wrapping checks that every rank built the same model and makes rank 0's weights everyone's.
  auto strategy = make_strategy(cfg, model, world.comm);
  strategy->build_optimizer(cfg.optim);
  // airbench's lookahead keeps a moving average of the weights (after the strategy made them every rank's).
  std::unique_ptr<optim::Ema> lookahead;
  if (cfg.train.lookahead) lookahead = std::make_unique<optim::Ema>(*model, 0.95);
  if (resuming) {
    // See Note [Strategy state in the training-state file]; the lookahead average travels the same way.
    checkpoint::NamedTensors opt_state, strategy_state, lookahead_state;
    for (auto& [name, t] : resume.optimizer) {
      if (name.rfind(kStrategyPrefix, 0) == 0)
        strategy_state.emplace_back(name.substr(kStrategyPrefix.size()), t);
      else if (name.rfind(kLookaheadPrefix, 0) == 0)
        lookahead_state.emplace_back(name.substr(kLookaheadPrefix.size()), t);
      else
        opt_state.emplace_back(name, t);
    }
    // A sharded save's weights are its float32 masters (its shards hold nothing else): under fp16-master
    // they become the masters again, not the fp16 weights rounded from them. A ddp save names its own.
    const bool has_masters = std::any_of(opt_state.begin(), opt_state.end(),
                                         [](const auto& e) { return e.first.rfind(amp::kMasterPrefix, 0) == 0; });
    if (precision.precision() == amp::Precision::kFp16Master && !has_masters)
      for (const auto& [name, t] : resume.model) opt_state.emplace_back(amp::kMasterPrefix + name, t);
    strategy->load_optimizer_state(opt_state);
    strategy->load_state_dict(strategy_state);
    if (lookahead && !lookahead_state.empty()) lookahead->load_state_dict(lookahead_state);
    const auto& st = resume.state;
    if (precision.scaling() && st.loss_scale > 0)
      precision.load_scaler({st.loss_scale, st.loss_scale_growth_tracker, st.skipped_steps});
  }

  data::DistributedSampler sampler(data.train->size(), world_size, rank, /*shuffle=*/true, cfg.train.seed,
                                   /*drop_last=*/false);
  data::DistributedSampler test_sampler(data.test->size(), world_size, rank, false, cfg.train.seed, false);
  // In-memory datasets build a batch in well under a millisecond: a prefetch thread would only compete
  // with the step for the cores. Decoded datasets run ahead.
  const int64_t prefetch = cfg.data.name == "imagefolder" ? cfg.data.prefetch : 0;
  const int64_t batch = cfg.data.batch_size;
  const int64_t accum = cfg.train.grad_accum_steps;
  const int64_t steps_per_epoch = sampler.num_samples() / (batch * accum);
  if (steps_per_epoch == 0)
    throw ConfigError("rank " + std::to_string(rank) + ": data.batch_size x train.grad_accum_steps = " +
                          std::to_string(batch * accum) + " exceeds this rank's " +
                          std::to_string(sampler.num_samples()) + " training images",
                      "lower data.batch_size, or use fewer workers");
  const int64_t total_steps = cfg.train.epochs * steps_per_epoch;
  const int64_t global_batch = batch * accum * world_size;
  const double peak_lr = cfg.optim.lr * (cfg.optim.scale_lr ? double(global_batch) / cfg.optim.base_batch : 1.0);
  const optim::Schedule schedule(cfg.sched, peak_lr, total_steps, steps_per_epoch);
  const int64_t stop_step = cfg.train.max_steps > 0 ? std::min(total_steps, cfg.train.max_steps) : total_steps;

  int64_t step = resuming ? resume.state.step : 0;
  double best = resuming ? resume.state.best_test_accuracy : -1;
  if (resuming && resume.state.world_size != world_size && lead)
    std::cerr << "cohort: note: resuming a run saved with " << resume.state.world_size << " workers on " << world_size
              << "; the data order from here on differs from the original run\n";

  Progress progress(lead ? Progress::resolve(cfg.log.progress, isatty(STDOUT_FILENO) != 0) : Progress::Mode::kOff,
                    std::cout);
  JsonLines metrics;
  std::unique_ptr<log::EventWriter> tensorboard;
  const auto config_json = config::to_json(cfg);
  if (lead) {
    metrics = JsonLines(run_dir / "metrics.jsonl");
    if (cfg.log.tensorboard) tensorboard = std::make_unique<log::EventWriter>(run_dir);
    util::write_file_atomic(run_dir / "config.json", config_json.dump(2) + "\n");
    std::cout << "cohort: " << world_size << " worker(s), model " << cfg.model.name << ", data " << data.train->name()
              << ", " << strategy->name()
              << " over " << comm.backend_name() << ", global batch " << global_batch << ", " << total_steps
              << " steps (" << steps_per_epoch << "/epoch), " << describe(chosen) << ", run dir " << run_dir.string()
              << (resuming ? ", resuming at step " + std::to_string(step) : "") << std::endl;
  }

  // "last" goes to a fresh step directory, committed and pruned (checkpoint/Steps.h); "best" is one
  // pair of files that each save replaces.
  const fs::path ck_dir = run_dir / "checkpoints";
  int64_t last_saved_step = -1, sharded_saves = 0;
  double last_saved_best = -2;
  PhaseClock clock;  // where the time goes, phase by phase (train/PhaseClock.h)
  auto save = [&](const std::string& tag, int64_t epoch_of_next) {
    const PhaseClock::Scope saving(clock, Phase::kCheckpoint);
    checkpoint::TrainState st{step, epoch_of_next, best, world_size, config_json.dump()};
    if (precision.scaling()) {
      const auto& sc = precision.scaler().state();
      st.loss_scale = sc.scale, st.loss_scale_growth_tracker = sc.growth_tracker, st.skipped_steps = sc.skipped_steps;
    }
    const bool last = tag == "last";
    // The end of training often saves the state the last periodic save already holds: a second copy
    // would only push an older, distinct save out of retention. (step and best agree on every rank.)
    if (last && step == last_saved_step && best == last_saved_best) return;
    if (last) last_saved_step = step, last_saved_best = best;
    // A sharded save is written by every rank into one directory, which rank 0 names.
    fs::path dir = ck_dir;
    if (last && strategy->sharded())
      dir = decided_by_rank0(world, "cohort/ckpt_dir/" + std::to_string(sharded_saves++),
                             [&] { return checkpoint::new_step_dir(ck_dir, step).string(); });
    else if (last)
      dir = checkpoint::new_step_dir(ck_dir, step);
    auto commit = [&] {
      if (last && lead) checkpoint::commit_step(ck_dir, dir, step, static_cast<int>(cfg.ckpt.keep_last));
    };
    if (strategy->sharded()) {  // every rank writes its slice; see checkpoint/Sharded.h
      auto shard = strategy->shard_state();
      checkpoint::save_sharded(dir, tag, shard.tensors, shard.layout, st, comm);
      commit();
      return;
    }
    // Collective (a compression hook gathers every rank's residuals), so every rank takes part.
    const auto strategy_state = strategy->state_dict();
    if (!lead) return;
    auto state = strategy->optimizer_state();
    for (const auto& [name, t] : strategy_state) state.emplace_back(kStrategyPrefix + name, t);
    if (lookahead)
      for (const auto& [name, t] : lookahead->state_dict()) state.emplace_back(kLookaheadPrefix + name, t);
    checkpoint::save(dir, tag, *model, state, st);
    commit();
  };

  TrainResult result;
  result.run_dir = run_dir;
  MetricWindow window;
  double window_grad_norm = -1;  // the last step's gradient norm, when clipping computes it
  double train_seconds = 0;
  int64_t images_seen = 0;
  double test_accuracy = -1;
  int64_t last_eval_step = -1;
  Clock::time_point window_start = Clock::now();
  int64_t window_images = 0;
  const auto session_start = Clock::now();
  const int64_t first_step = step;
  const char* fault_env = std::getenv("COHORT_FAULT_STEP");
  const char* fault_rank_env = std::getenv("COHORT_FAULT_RANK");
  const int64_t fault_step = fault_env ? std::atoll(fault_env) : 0;
  const int fault_rank = fault_rank_env ? std::atoi(fault_rank_env) : 1;
  // COHORT_FAULT_NONFINITE_STEPS="3,8": rank COHORT_FAULT_RANK's gradient gets an inf (odd steps) or a NaN
  // (even steps) after backward of those steps, as an fp16 overflow on one rank would.
  const auto nonfinite_steps = fault_steps_from_env("COHORT_FAULT_NONFINITE_STEPS");
  // Model-state bytes, sampled in the session's first step with gradients present (after backward) and
  // with optimizer state present (after the update): the larger of each.
  StateBytes state_bytes;
  auto max_bytes = [](StateBytes a, StateBytes b) {
    return StateBytes{std::max(a.params, b.params), std::max(a.grads, b.grads), std::max(a.optimizer, b.optimizer)};
  };

  auto run_eval = [&](int64_t epoch) {
    if (!cfg.eval.enabled) return;
    const PhaseClock::Scope evaluating(clock, Phase::kEval);
    const auto r =
        evaluate(*model, *data.test, test_sampler, cfg.eval.batch_size, prefetch, cfg.eval.tta, comm, placement);
    test_accuracy = r.top1();
    last_eval_step = step;
    const bool improved = test_accuracy > best;
    if (improved) best = test_accuracy;
    if (lead) {
      metrics.write({{"kind", "eval"}, {"step", step}, {"epoch", epoch}, {"test_loss", r.loss()},
                     {"test_top1", r.top1()}, {"test_top5", r.top5()}, {"best_test_top1", best},
                     {"train_seconds", train_seconds}, {"time", std::time(nullptr)}});
      if (tensorboard) {
        tensorboard->add_scalar("val/loss", r.loss(), step);
        tensorboard->add_scalar("val/top1", r.top1(), step);
        tensorboard->add_scalar("val/top5", r.top5(), step);
        tensorboard->flush();
      }
      std::cout << "epoch " << epoch + 1 << " test: loss " << std::setprecision(4) << r.loss() << " top1 "
                << percent(r.top1()) << " top5 " << percent(r.top5()) << " (best " << percent(best) << ")"
                << std::endl;
    }
    if (improved && cfg.ckpt.save_best) {
      save("best", epoch + 1);
      if (lead && !cfg.ckpt.upload.empty() && cfg.ckpt.upload_best_every_time) upload_checkpoint(cfg, run_dir);
    }
  };

  model->train();
  for (int64_t epoch = step / steps_per_epoch; epoch < cfg.train.epochs && step < stop_step; ++epoch) {
    // airbench trains its whitening bias for the first epochs only; a resumed run re-freezes it here too.
    if (cfg.train.whiten_bias_epochs > 0 && epoch >= cfg.train.whiten_bias_epochs) strategy->freeze("whiten.bias");
    const auto order = sampler.indices(epoch);
    const data::AugmentOptions aug{cfg.data.augment, cfg.data.crop_padding, true, cfg.train.seed, epoch,
                                   cfg.data.flip == "alternating"};
    const auto epoch_start = Clock::now();
    // The batches this epoch will train on, from where a resumed run left off to the epoch's end or stop_step.
    const int64_t epoch_first = step % steps_per_epoch;
    const int64_t epoch_steps = std::min(steps_per_epoch, epoch_first + stop_step - step) - epoch_first;
    data::Loader loader(*data.train, batches_of(order, batch, epoch_first * accum, epoch_steps * accum), aug, prefetch,
                        /*pin=*/device.is_cuda());
    for (int64_t s = step % steps_per_epoch; s < steps_per_epoch && step < stop_step; ++s) {
      const auto t0 = Clock::now();
      double step_loss = 0;
      for (int64_t micro = 0; micro < accum; ++micro) {
        clock.switch_to(Phase::kData);
        auto b = *loader.next();
        const auto images = images_to(b.images, device, nhwc);
        const auto labels = b.labels.to(device, /*non_blocking=*/b.labels.is_pinned());
        clock.switch_to(Phase::kForward);
        auto sync = strategy->gradient_sync(micro == accum - 1);
        at::Tensor logits;
        {
          auto autocast = precision.autocast();
          logits = precision.logits(model->forward(precision.input(images)));
        }
        auto loss = torch::nn::functional::cross_entropy(
            logits, labels, torch::nn::functional::CrossEntropyFuncOptions().label_smoothing(cfg.loss.label_smoothing));
        clock.switch_to(Phase::kBackward);
        precision.scale(accum > 1 ? loss / static_cast<double>(accum) : loss).backward();
        if (step == first_step) state_bytes = max_bytes(state_bytes, strategy->state_bytes());
        const double l = loss.item<double>();
        window.add(logits, labels, l);
        step_loss += l / static_cast<double>(accum);
      }
      if (rank == fault_rank && nonfinite_steps.count(step + 1)) poison_gradient(*model, step + 1);
      clock.switch_to(Phase::kOptimizer);
      const auto stepped = strategy->step(schedule.lr(step), {cfg.optim.clip_grad_norm, precision.scaling(),
                                                              precision.loss_scale()});
      // Under loss scaling an overflow skips the step on every rank and lowers the scale. In fp32 or bf16 a
      // non-finite gradient is divergence, not an overflow to skip: stop with the last good checkpoint
      // kept rather than train on NaN weights. Every rank sees the same answer.
      precision.after_step(stepped.nonfinite, step + 1);
      if (stepped.nonfinite && !precision.scaling())
        throw Error("step " + std::to_string(step + 1) + ": the gradient holds inf or NaN (loss of this rank's last batch: " +
                        std::to_string(step_loss) + "); the weights were not updated",
                    "lower optim.lr or set optim.clip_grad_norm, and check the data; resume from the last checkpoint with "
                    "--resume " + run_dir.string());
      clock.switch_to(Phase::kOther);
      if (stepped.grad_norm >= 0) window_grad_norm = stepped.grad_norm;
      // Fault injection for the restart tests: COHORT_FAULT_STEP=N kills rank COHORT_FAULT_RANK (default
      // 1) with SIGKILL right after step N, in the first attempt only.
      if (fault_step > 0 && info.restart_count == 0 && step + 1 == fault_step && rank == fault_rank) ::raise(SIGKILL);
      if (step == first_step) state_bytes = max_bytes(state_bytes, strategy->state_bytes());
      ++step;
      if (lookahead && step % 5 == 0) lookahead->lookahead(*model, optim::airbench_lookahead_decay(step, total_steps));
      // The run ends on the average itself (decay 1: the weights become the average).
      if (lookahead && step == total_steps) lookahead->lookahead(*model, 1.0);
      result.step_losses.push_back(step_loss);
      train_seconds += seconds_since(t0);
      images_seen += global_batch;
      window_images += global_batch;
      progress.update({epoch, cfg.train.epochs, s + 1, steps_per_epoch, step, total_steps, step_loss,
                       window_images / std::max(seconds_since(window_start), 1e-9), seconds_since(session_start),
                       step - first_step});

      if (step % cfg.log.every_steps == 0 || step == stop_step) {
        const auto g = window.reduce(comm, "training metrics");
        const double ips = window_images / std::max(seconds_since(window_start), 1e-9);
        const auto res = gather_resources(monitor, comm, world_size);
        if (lead) {
          nlohmann::json train_rec = {
              {"kind", "train"}, {"step", step}, {"epoch", epoch}, {"loss", g.loss()}, {"top1", g.top1()},
              {"top5", g.top5()}, {"lr", schedule.lr(step - 1)}, {"images_per_second", ips},
              {"step_loss_rank0", step_loss}, {"train_seconds", train_seconds},
              {"sync_bytes", strategy->last_sync_bytes().wire},
              {"sync_bytes_uncompressed", strategy->last_sync_bytes().dense},
              {"grad_norm", window_grad_norm < 0 ? nlohmann::json() : nlohmann::json(window_grad_norm)},
              {"time", std::time(nullptr)}};
          if (precision.scaling()) {
            train_rec["loss_scale"] = precision.loss_scale();
            train_rec["skipped_steps"] = precision.scaler().state().skipped_steps;
          }
          metrics.write(train_rec);
          nlohmann::json rss = nlohmann::json::array(), cpu = nlohmann::json::array(),
                         gpu_util = nlohmann::json::array(), gpu_mem = nlohmann::json::array();
          for (int r = 0; r < world_size; ++r) {
            const double* f = res.data() + r * kResourceFields;
            rss.push_back(static_cast<int64_t>(f[0]));
            cpu.push_back(f[2]);
            if (f[3] >= 0) {
              gpu_util.push_back(f[3]);
              gpu_mem.push_back(static_cast<int64_t>(f[4]));
            }
          }
          nlohmann::json rec = {{"kind", "resources"}, {"step", step}, {"rss_bytes", rss}, {"cpu_percent", cpu},
                                {"train_seconds", train_seconds}, {"time", std::time(nullptr)}};
          if (!gpu_util.empty()) {
            rec["gpu_util_percent"] = gpu_util;
            rec["gpu_memory_used_bytes"] = gpu_mem;
          }
          metrics.write(rec);
          if (tensorboard) {
            for (int r = 0; r < world_size; ++r) {
              const double* f = res.data() + r * kResourceFields;
              const std::string who = "/rank" + std::to_string(r);
              tensorboard->add_scalar("memory/rss_mb" + who, f[0] / (1 << 20), step);
              tensorboard->add_scalar("memory/peak_rss_mb" + who, f[1] / (1 << 20), step);
              tensorboard->add_scalar("cpu/percent" + who, f[2], step);
              if (f[3] >= 0) {
                tensorboard->add_scalar("gpu/util_percent" + who, f[3], step);
                tensorboard->add_scalar("gpu/memory_used_mb" + who, f[4] / (1 << 20), step);
              }
            }
            tensorboard->add_scalar("train/loss", g.loss(), step);
            tensorboard->add_scalar("train/top1", g.top1(), step);
            tensorboard->add_scalar("train/top5", g.top5(), step);
            tensorboard->add_scalar("train/lr", schedule.lr(step - 1), step);
            tensorboard->add_scalar("train/images_per_second", ips, step);
            tensorboard->add_scalar("train/sync_bytes", static_cast<double>(strategy->last_sync_bytes().wire), step);
            if (precision.scaling()) tensorboard->add_scalar("amp/loss_scale", precision.loss_scale(), step);
          }
          if (progress.mode() == Progress::Mode::kPlain) {
            std::cout << "epoch " << epoch + 1 << "/" << cfg.train.epochs << " step " << step << "/" << total_steps
                      << " loss " << std::fixed << std::setprecision(4) << g.loss() << " top1 " << percent(g.top1())
                      << " lr " << std::setprecision(5) << schedule.lr(step - 1) << " " << std::setprecision(0)
                      << ips << " img/s" << std::defaultfloat << std::endl;
          }
        }
        window.reset();
        window_images = 0;
        window_start = Clock::now();
      }
      if (cfg.ckpt.every_steps > 0 && step % cfg.ckpt.every_steps == 0) save("last", step / steps_per_epoch);
    }
    progress.end_epoch();
    if (lead) {
      metrics.write({{"kind", "epoch"}, {"epoch", epoch}, {"step", step}, {"epoch_seconds", seconds_since(epoch_start)}});
      if (tensorboard) tensorboard->flush();
    }
    if (step % steps_per_epoch == 0) {  // the epoch ran to its end, not to train.max_steps
      run_eval(epoch);
      if (cfg.ckpt.every_steps == 0) save("last", epoch + 1);
    }
  }
  // A run stopped by train.max_steps still reports a test accuracy and leaves a resumable checkpoint.
  const int64_t final_epoch = std::max<int64_t>(0, (step - 1) / steps_per_epoch);
  if (last_eval_step != step) run_eval(final_epoch);
  save("last", step / steps_per_epoch);
  clock.stop();
  const auto time_breakdown = gather_time_breakdown(clock, comm);

  // Per-rank peak memory, CPU and GPU use, gathered so rank 0 can report every rank.
  monitor.sample_now();  // so a run shorter than log.monitor_s still has one sample
  const auto tot = monitor.totals();
  constexpr int kTotals = 7;
  auto mine = at::tensor({double(util::peak_rss_bytes()), tot.mean_cpu_percent, tot.has_gpu ? 1.0 : 0.0,
                          tot.mean_gpu_util_percent, tot.max_gpu_util_percent, double(tot.peak_gpu_memory_used),
                          double(tot.gpu_memory_total)},
                         at::kDouble);
  auto all_tot = at::zeros({world_size * kTotals}, at::kDouble);
  comm.all_gather(all_tot, mine, "resource totals")->wait();
  auto my_state = at::tensor({state_bytes.params, state_bytes.grads, state_bytes.optimizer}, at::kLong);
  auto all_state = at::zeros({world_size * 3}, at::kLong);
  comm.all_gather(all_state, my_state, "model-state bytes")->wait();
  // Each rank skipped the bad files it met; the run's count is their sum (a file met by two ranks counts twice).
  auto bad = at::full({1}, data.train->bad_files() + data.test->bad_files(), at::kLong);
  auto all_bad = at::zeros({world_size}, at::kLong);
  comm.all_gather(all_bad, bad, "bad file counts")->wait();
  const int64_t bad_files = all_bad.sum().item<int64_t>();
  result.steps = step;
  result.train_seconds = train_seconds;
  result.images_per_second = train_seconds > 0 ? images_seen / train_seconds : 0;
  result.test_accuracy = test_accuracy;
  result.best_test_accuracy = best;
  if (lead) {
    const auto sync = strategy->last_sync_bytes();
    std::vector<int64_t> per_rank;
    nlohmann::json resources = nlohmann::json::array();
    for (int r = 0; r < world_size; ++r) {
      const double* f = all_tot.data_ptr<double>() + r * kTotals;
      per_rank.push_back(static_cast<int64_t>(f[0]));
      nlohmann::json one = {{"rank", r}, {"peak_rss_bytes", per_rank.back()}, {"mean_cpu_percent", f[1]}};
      if (f[2] > 0) {
        one["gpu_mean_util_percent"] = f[3];
        one["gpu_max_util_percent"] = f[4];
        one["gpu_peak_memory_used_bytes"] = static_cast<int64_t>(f[5]);
        one["gpu_memory_total_bytes"] = static_cast<int64_t>(f[6]);
      }
      const int64_t* b = all_state.data_ptr<int64_t>() + r * 3;
      one["model_state_bytes"] = {{"params", b[0]}, {"grads", b[1]}, {"optimizer", b[2]}, {"total", b[0] + b[1] + b[2]}};
      resources.push_back(one);
    }
    metrics.write({{"kind", "model_state"}, {"step", step}, {"strategy", strategy->name()}, {"per_rank", resources},
                   {"time", std::time(nullptr)}});
    nlohmann::json summary = {
        {"world_size", world_size}, {"nnodes", info.nnodes}, {"launcher", info.launcher},
        {"strategy", strategy->name()}, {"backend", comm.backend_name()}, {"model", cfg.model.name},
        {"steps", step}, {"epochs", static_cast<double>(step) / steps_per_epoch}, {"steps_per_epoch", steps_per_epoch},
        {"global_batch", global_batch}, {"train_seconds", train_seconds},
        {"images_per_second", result.images_per_second}, {"test_accuracy", test_accuracy < 0 ? nlohmann::json() : nlohmann::json(test_accuracy)},
        {"best_test_accuracy", best < 0 ? nlohmann::json() : nlohmann::json(best)}, {"peak_rss_bytes", per_rank}, {"resources", resources},
        {"gpu_monitor", monitor.gpu_available() ? "nvml" : monitor.nvml().why_unavailable()},
        {"precision", cfg.amp.precision}, {"amp", precision.summary()}, {"device", device.str()},
        {"bad_files_skipped", bad_files}, {"threads_per_worker", at::get_num_threads()},
        {"optimizer", cfg.optim.name}, {"clip_grad_norm", cfg.optim.clip_grad_norm}, {"restarts", info.restart_count},
        {"compress", cfg.dist.compress}, {"sync_bytes_per_step", sync.wire},
        {"sync_bytes_per_step_uncompressed", sync.dense},
        {"compression_ratio", sync.wire > 0 ? nlohmann::json(double(sync.dense) / sync.wire) : nlohmann::json()},
        {"config", config_json}};
    summary["auto"] = to_json(chosen);
    summary["channels_last"] = nhwc;
    summary["time_breakdown"] = time_breakdown;
    util::write_file_atomic(run_dir / "summary.json", summary.dump(2) + "\n");
    std::cout << "cohort: done: " << step << " steps in " << std::fixed << std::setprecision(1) << train_seconds
              << " s, " << std::setprecision(0) << result.images_per_second << " img/s, test top1 "
              << percent(test_accuracy) << " (best " << percent(best) << "); time: " << clock.line() << "; "
              << (run_dir / "summary.json").string() << std::defaultfloat << std::endl;
    if (bad_files > 0)
      std::cout << "cohort: " << bad_files << " bad image file(s) were skipped (named above; data.on_bad_file=fail "
                << "stops at the first)" << std::endl;
  }
  comm.barrier("end of training")->wait();
  // After the barrier: the other ranks are done and no collective timeout runs while a large checkpoint
  // uploads. See Note [A failed upload keeps the run].
  if (lead && !cfg.ckpt.upload.empty()) {
    auto summary = nlohmann::json::parse(std::ifstream(run_dir / "summary.json"));
    summary["upload"] = upload_checkpoint(cfg, run_dir);
    util::write_file_atomic(run_dir / "summary.json", summary.dump(2) + "\n");
  }
  return result;
}

EvalResult run_eval_worker(const TrainConfig& cfg, const WorldInfo& info, const fs::path& checkpoint,
                           const fs::path& out) {
  at::set_num_threads(worker_threads(cfg, info));
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(cfg.dist.timeout_s * 1000));
  World world = rendezvous(info, cfg.dist.backend, timeout);
  const c10::Device device = training_device(cfg.train.device, info.local_rank);
  TrainConfig resolved = cfg;  // evaluation computes in fp32; only the layout is chosen (Note [What auto picks])
  resolve_auto(resolved, probe_hardware(device));
  const EvalPlacement placement{device, channels_last(resolved), nullptr};
  auto data = data::open_datasets(cfg, info.rank, info.local_world_size, /*need_train=*/false, placement.device);
  auto model = models::build(cfg.model, data.test->channels(), data.test->image_size());
  const auto weights = checkpoint::load_model_weights(checkpoint);
  checkpoint::load_weights(*model, weights.tensors, weights.source);
  data::DistributedSampler sampler(data.test->size(), info.world_size, info.rank, false, cfg.train.seed, false);
  const int64_t prefetch = cfg.data.name == "imagefolder" ? cfg.data.prefetch : 0;
  model->to(placement.device);
  if (placement.channels_last) to_channels_last(*model);
  const auto r =
      evaluate(*model, *data.test, sampler, cfg.eval.batch_size, prefetch, cfg.eval.tta, *world.comm, placement);
  EvalResult e{r.loss(), r.top1(), r.top5(), static_cast<int64_t>(r.count)};
  if (info.rank == 0) {
    const nlohmann::json j = {{"checkpoint", fs::absolute(checkpoint).string()}, {"model", cfg.model.name},
                              {"dataset", cfg.data.name}, {"images", e.images}, {"loss", e.loss},
                              {"top1", e.top1}, {"top5", e.top5}, {"world_size", info.world_size}};
    std::cout << "cohort: eval " << checkpoint.string() << " on " << e.images << " images: top1 " << percent(e.top1)
              << " top5 " << percent(e.top5) << " loss " << std::setprecision(4) << e.loss << std::endl;
    if (!out.empty()) util::write_file_atomic(out, j.dump(2) + "\n");
  }
  world.comm->barrier("end of evaluation")->wait();
  return e;
}

}  // namespace cohort::train

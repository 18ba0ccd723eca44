#include "cohort/train/TrainingRun.h"

#include <unistd.h>

#include <chrono>
#include <csignal>
#include <fstream>
#include <iostream>
#include <sstream>

#include <torch/torch.h>

#include "cohort/amp/MixedPrecision.h"
#include "cohort/checkpoint/Checkpoint.h"
#include "cohort/checkpoint/Names.h"
#include "cohort/checkpoint/Steps.h"
#include "cohort/comm/FaultInjection.h"
#include "cohort/comm/FlightRecorder.h"
#include "cohort/comm/Rendezvous.h"
#include "cohort/data/Datasets.h"
#include "cohort/data/DistributedSampler.h"
#include "cohort/log/Peak.h"
#include "cohort/log/ResourceMonitor.h"
#include "cohort/models/Flops.h"
#include "cohort/models/Loss.h"
#include "cohort/models/Models.h"
#include "cohort/optim/Ema.h"
#include "cohort/optim/Schedule.h"
#include "cohort/record/Metrics.h"
#include "cohort/record/PhaseClock.h"
#include "cohort/record/Progress.h"
#include "cohort/record/RunLog.h"
#include "cohort/record/RunSummary.h"
#include "cohort/train/AutoSettings.h"
#include "cohort/train/Checkpointing.h"
#include "cohort/train/Device.h"
#include "cohort/train/Evaluate.h"
#include "cohort/train/InitialWeights.h"
#include "cohort/train/RankAgreement.h"
#include "cohort/train/Recipe.h"
#include "cohort/train/Setup.h"
#include "cohort/train/StrategyFactory.h"
#include "cohort/upload/CheckpointUpload.h"
#include "cohort/util/AtomicFile.h"
#include "cohort/util/Error.h"
#include "cohort/util/StopSignal.h"

namespace cohort::train {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using record::Phase;
using record::PhaseClock;
using record::Progress;

namespace {

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// A non-finite gradient in fp32 or bf16: what happened to the weights, and how to go on.
Error diverged(int64_t step, double step_loss, const parallel::StepResult& stepped, const fs::path& run_dir) {
  return Error("step " + std::to_string(step) +
                   ": the gradient holds inf or NaN (loss of this rank's last batch: " + std::to_string(step_loss) +
                   (stepped.updated_in_backward
                        ? "); optim.in_backward had already updated the parameters of the buckets before the "
                          "first non-finite one, in memory only: nothing was saved"
                        : "); the weights were not updated"),
               "lower optim.lr or set optim.clip_grad_norm, and check the data; resume from the last checkpoint with "
               "--resume " +
                   run_dir.string());
}

}  // namespace

// Restores a checkpoint or catches up with the live peers (Strategy::catch_up), and says what the run is.
TrainingRun::TrainingRun(const TrainConfig& cfg, const comm::WorldInfo& info, comm::World& world, Job& job,
                         const fs::path& run_dir, const Resume& resume)
    : cfg_(cfg),
      info_(info),
      world_(world),
      job_(job),
      run_dir_(run_dir),
      lead_(info.rank == 0),
      sampler_(training_sampler(cfg, job.data.train->size(), info)),
      test_sampler_(job.data.test->size(), info.world_size, info.rank, false, cfg.train.seed, false),
      traits_(strategy_traits(cfg, info.rank, info.world_size)),
      plan_(make_plan(cfg, sampler_, info)),
      batches_(cfg, *job.data.train, sampler_, plan_, traits_.endless_step_samples > 0, job.device.is_cuda()),
      config_json_(config::to_json(cfg)),
      monitor_(cfg.log.monitor_s, run_dir / ("resources.rank" + std::to_string(info.rank) + ".jsonl"), info.local_rank),
      progress_(lead_ ? Progress::resolve(cfg.log.progress, isatty(STDOUT_FILENO) != 0) : Progress::Mode::kOff,
                std::cout),
      log_(cfg, run_dir, info.world_size, lead_, progress_.mode() == Progress::Mode::kPlain),
      checkpoints_(cfg, run_dir, world, {*job.model, *job.strategy, *job.precision, job.lookahead.get()},
                   config_json_.dump()),
      recipe_(cfg, *job.model, *job.strategy, job.lookahead.get(), plan_.total_steps),
      trace_(config::trace_step_range(cfg.log.trace_steps), run_dir, info.rank, world.comm->flight()),
      watch_(clock_, trace_, window_, comm::FaultPlan::from_env(), info, *world.comm) {
  if (resume.active()) {
    checkpoints_.restore(resume.checkpoint);
    step_ = resume.checkpoint.state.step;
    best_ = resume.checkpoint.state.best_test_accuracy;
    if (resume.checkpoint.state.world_size != info.world_size && lead_)
      std::cerr << "cohort: note: resuming a run saved with " << resume.checkpoint.state.world_size << " workers on "
                << info.world_size << "; the data order from here on differs from the original run\n";
  }
  // A process joining peers under way (or resuming behind them) takes their state and step; a strategy
  // with a fixed world has nobody to catch up with.
  if (const auto caught_up = job.strategy->catch_up(step_)) {
    step_ = *caught_up;
  }
  first_step_ = step_;
  const auto [trace_from, trace_to] = config::trace_step_range(cfg.log.trace_steps);
  if (trace_from > 0) clock_.trace_into(&trace_);  // untraced runs' phase switches skip it entirely
  if (lead_ && trace_from > 0 && (trace_from > plan_.stop_step || trace_to <= step_))
    std::cerr << "cohort: WARNING: log.trace_steps=" << cfg.log.trace_steps << " lies outside this run's steps "
              << step_ + 1 << " to " << plan_.stop_step << ": nothing will be traced" << std::endl;
  log_.started(config_json_, first_line(resume.active()),
               record::tracker_tags({cfg_, config_json_, info_.world_size, info_.launcher, job.strategy->name(),
                                     job.precision->name(), run_dir_, traits_.groups_runs}));
}

std::string TrainingRun::first_line(bool resuming) const {
  std::ostringstream os;
  os << "cohort: " << info_.world_size << " worker(s), model " << cfg_.model.name << ", data "
     << job_.data.train->name() << ", " << job_.strategy->name() << " over " << world_.comm->backend_name()
     << ", global batch " << plan_.global_batch << ", " << plan_.total_steps << " steps (" << plan_.steps_per_epoch
     << "/epoch), " << describe(job_.chosen) << ", run dir " << run_dir_.string()
     << (resuming ? ", resuming at step " + std::to_string(step_) : "");
  return os.str();
}

void TrainingRun::train_epoch(int64_t epoch) {
  recipe_.epoch_started(epoch);  // a resumed run re-freezes what trains for the first epochs only
  const auto epoch_start = Clock::now();
  // The batches this epoch will train on, from where a resumed run left off to the epoch's end or stop_step.
  const int64_t first = step_ % plan_.steps_per_epoch;
  const int64_t steps = std::min(plan_.steps_per_epoch, first + plan_.stop_step - step_) - first;
  batches_.start_epoch(epoch, first, steps);
  for (int64_t s = first; s < plan_.steps_per_epoch && step_ < plan_.stop_step;) {
    const auto t0 = Clock::now();
    // This process's first step counts the model's FLOPs (rank 0, the one that reports them).
    std::optional<models::FlopCounter> flops;
    if (lead_ && flops_per_image_ < 0) flops.emplace();
    pending_loss_ += train_step();
    if (flops && flops->counting()) flops_per_image_ = flops->total() / static_cast<double>(plan_.batch * plan_.accum);
    flops.reset();
    ++pending_batches_;
    const bool applied = optimizer_step(pending_loss_ / static_cast<double>(pending_batches_));
    train_seconds_ += seconds_since(t0);
    if (!applied) continue;  // the strategy accumulated the batch toward a later step (StepResult::applied)
    after_step(epoch, s, pending_loss_ / static_cast<double>(pending_batches_));
    pending_loss_ = 0;
    pending_batches_ = 0;
    ++s;
    // eval.every_steps: within the epoch (its end and the run's end are evaluated by run_worker).
    if (cfg_.eval.every_steps > 0 && step_ % cfg_.eval.every_steps == 0 && s < plan_.steps_per_epoch &&
        step_ < plan_.stop_step)
      evaluate(epoch);
    if (stop_requested()) break;
    // A process that fell behind its peers (frozen, slow, or its rounds failed) takes their state.
    if (const auto caught_up = job_.strategy->catch_up(step_)) {
      // The loader cannot rewind: Note [A peer never goes back] in SwarmPeer.cpp.
      COHORT_ASSERT(*caught_up >= step_, "a catch-up went back from step " + std::to_string(step_));
      s += *caught_up - step_;
      step_ = *caught_up;
    }
  }
  batches_.end_epoch();
  progress_.end_epoch();
  log_.epoch_ended(epoch, step_, seconds_since(epoch_start));
}

// Whether to leave now: see agreed_stop_signal (RankAgreement.h) for how the ranks agree on the step.
bool TrainingRun::stop_requested() {
  const int sig = agreed_stop_signal(world_, util::stop_signal(), step_, traits_.leaves_alone, job_.device);
  stop_signal_ = sig;
  if (sig != 0 && lead_)
    std::cerr << "cohort: " << util::signal_name(sig) << ": leaving after step " << step_ << "; saving "
              << (run_dir_ / "last").string()
              << (sig == SIGUSR1 ? " (a scheduler's warning before preemption: resume with --resume)"
                                 : " (Ctrl-C again to stop at once, unsaved)")
              << std::endl;
  return sig != 0;
}

// Forward and backward of each micro-batch; the gradients synchronize on the last one. Returns the step's
// loss (this rank's batches). watch_ is what watches the step: Note [The step and what watches it].
double TrainingRun::train_step() {
  auto& precision = *job_.precision;
  const parallel::Strategy* sample = step_ == first_step_ ? job_.strategy.get() : nullptr;  // the state bytes
  double step_loss = 0;
  watch_.step_begins(step_ + 1);
  for (int64_t micro = 0; micro < plan_.accum; ++micro) {
    const bool last = micro == plan_.accum - 1;
    watch_.batch_begins(step_ + 1);
    auto b = batches_.next();
    const auto images = images_to(b.images, job_.device, job_.nhwc);
    const auto labels = b.labels.to(job_.device, /*non_blocking=*/b.labels.is_pinned());
    watch_.forward_begins();
    auto sync = job_.strategy->gradient_sync(last);
    at::Tensor logits;
    {
      auto autocast = precision.autocast();
      logits = precision.logits(job_.model->forward(precision.input(images)));
    }
    auto loss = models::training_loss(logits, labels, cfg_.loss);
    watch_.backward_begins();
    // optim.in_backward steps during the last micro-batch's backward: Note [The optimizer inside backward].
    if (last) job_.strategy->prepare_step(plan_.schedule.lr(step_), step_options());
    precision.scale(plan_.accum > 1 ? loss / static_cast<double>(plan_.accum) : loss).backward();
    const double l = loss.item<double>();
    watch_.batch_done(logits, labels, l, sample);
    step_loss += l / static_cast<double>(plan_.accum);
  }
  watch_.gradients_ready(*job_.model, step_ + 1);
  return step_loss;
}

// Returns false when the strategy only accumulated the batch (StepResult::applied: it waits for its peers).
bool TrainingRun::optimizer_step(double step_loss) {
  auto& precision = *job_.precision;
  watch_.optimizer_begins();
  const auto stepped = job_.strategy->step(plan_.schedule.lr(step_), step_options());
  if (!stepped.applied) return false;
  // Under loss scaling an overflow skips the step on every rank and lowers the scale. In fp32 or bf16 a
  // non-finite gradient is divergence, not an overflow to skip: stop with the last good checkpoint kept
  // rather than train on NaN weights. Every rank sees the same answer.
  precision.after_step(stepped.nonfinite, step_ + 1);
  if (stepped.nonfinite && !precision.scaling()) throw diverged(step_ + 1, step_loss, stepped, run_dir_);
  watch_.optimizer_done();
  if (stepped.grad_norm >= 0) grad_norm_ = stepped.grad_norm;
  watch_.step_done(step_ + 1, step_ == first_step_ ? job_.strategy.get() : nullptr);
  ++step_;
  recipe_.step_done(step_);
  return true;
}

parallel::StepOptions TrainingRun::step_options() const {
  const auto& precision = *job_.precision;
  return {cfg_.optim.clip_grad_norm,    precision.scaling(),           precision.loss_scale(), step_,
          step_ + 1 == plan_.stop_step, plan_.schedule.momentum(step_)};
}

// Every worker's peak FLOP/s together, for the windows' MFU: rank 0 resolves it once it has counted the
// FLOPs (a CPU's is measured once per machine and dtype, then cached: log/Peak.h).
double TrainingRun::peak_flops() {
  if (!lead_ || flops_per_image_ <= 0) return -1;
  if (!peak_resolved_) {
    peak_ = log::device_peak(job_.device, job_.precision->compute_dtype(), &peak_why_);
    peak_resolved_ = true;
  }
  return peak_ ? peak_->flops * info_.world_size : -1.0;
}

// Progress, the log window when one ends, and the periodic save.
void TrainingRun::after_step(int64_t epoch, int64_t step_in_epoch, double step_loss) {
  step_losses_.push_back(step_loss);
  images_seen_ += plan_.global_batch;
  window_images_ += plan_.global_batch;
  const double ips = window_images_ / std::max(seconds_since(window_start_), 1e-9);
  progress_.update({epoch, plan_.epochs(), step_in_epoch + 1, plan_.steps_per_epoch, step_, plan_.total_steps,
                    step_loss, ips, seconds_since(session_start_), step_ - first_step_});
  if (step_ % cfg_.log.every_steps == 0 || step_ == plan_.stop_step) {
    const auto& precision = *job_.precision;
    const auto sync = job_.strategy->last_sync_bytes();
    const bool scaling = precision.scaling();
    const record::TrainWindow w{step_,
                                epoch,
                                plan_.epochs(),
                                plan_.total_steps,
                                plan_.schedule.lr(step_ - 1),
                                ips,
                                step_loss,
                                train_seconds_,
                                grad_norm_,
                                sync.wire,
                                sync.dense,
                                scaling,
                                scaling ? precision.loss_scale() : 0.0,
                                scaling ? precision.scaler().state().skipped_steps : int64_t{0},
                                job_.strategy->figures(),
                                flops_per_image_,
                                peak_flops()};
    log_.train_window(w, window_, monitor_, *world_.comm);
    window_images_ = 0;
    window_start_ = Clock::now();
  }
  // A periodic save of a step that ends the epoch or the run waits for that step's evaluation, so the
  // step is saved once, with the best accuracy the evaluation finds (not once before it and once after).
  if (cfg_.ckpt.every_steps > 0 && step_ % cfg_.ckpt.every_steps == 0) {
    const bool evaluated_next =
        (step_in_epoch + 1 == plan_.steps_per_epoch && cfg_.eval.enabled) || step_ == plan_.stop_step;
    if (evaluated_next)
      save_due_ = true;
    else
      save_last();
  }
}

// The test set across ranks; a better accuracy is saved as "best" (and uploaded, when asked to each time).
void TrainingRun::evaluate(int64_t epoch) {
  if (!cfg_.eval.enabled) return;
  const PhaseClock::Scope evaluating(clock_, Phase::kEval);
  const auto r = train::evaluate(*job_.model, *job_.data.test, test_sampler_, cfg_.eval.batch_size,
                                 prefetch_batches(cfg_), cfg_.eval.tta, *world_.comm, job_.placement());
  test_accuracy_ = r.top1();
  last_eval_step_ = step_;
  const bool improved = test_accuracy_ > best_;
  if (improved) best_ = test_accuracy_;
  log_.evaluated({step_, epoch, r, best_, train_seconds_});
  if (!improved || !cfg_.ckpt.save_best) return;
  save(checkpoint::names::kBest, epoch + 1);
  if (lead_ && !cfg_.ckpt.upload.empty() && cfg_.ckpt.upload_best_every_time) upload::upload_checkpoint(cfg_, run_dir_);
}

void TrainingRun::save(const std::string& tag, int64_t epoch_of_next) {
  const PhaseClock::Scope saving(clock_, Phase::kCheckpoint);
  checkpoints_.save(tag, {step_, epoch_of_next, best_});
}

TrainResult TrainingRun::finish() {
  clock_.stop();
  trace_.finish();  // a run that stopped inside log.trace_steps' window writes what it traced
  peak_flops();     // a run that ended before its first log window resolves the summary's peak here
  const record::RunFacts facts{info_,
                               cfg_,
                               config_json_,
                               *job_.strategy,
                               *world_.comm,
                               *job_.precision,
                               to_json(job_.chosen),
                               job_.nhwc,
                               job_.device,
                               run_dir_,
                               step_,
                               plan_.steps_per_epoch,
                               plan_.global_batch,
                               images_seen_,
                               train_seconds_,
                               test_accuracy_,
                               best_,
                               watch_.state_bytes(),
                               job_.data.train->bad_files() + job_.data.test->bad_files(),
                               stop_signal_,
                               flops_per_image_,
                               peak_,
                               peak_why_};
  record::write_run_summary(facts, clock_, monitor_, log_);
  // A run a signal stopped (Ctrl-C, SIGTERM, Slurm's warning) had time to say so; an error unwinding
  // past here leaves the tracker's run FAILED (~RunLog).
  log_.close_trackers(stop_signal_ != 0 ? "KILLED" : "FINISHED");
  TrainResult result;
  result.run_dir = run_dir_;
  result.steps = step_;
  result.train_seconds = train_seconds_;
  result.images_per_second = train_seconds_ > 0 ? images_seen_ / train_seconds_ : 0;
  result.test_accuracy = test_accuracy_;
  result.best_test_accuracy = best_;
  result.step_losses = std::move(step_losses_);
  result.stop_signal = stop_signal_;
  return result;
}

}  // namespace cohort::train

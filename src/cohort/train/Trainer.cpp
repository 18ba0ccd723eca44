#include "cohort/train/Trainer.h"

#include <csignal>
#include <fstream>
#include <iostream>

#include <nlohmann/json.hpp>

#include "cohort/comm/FlightRecorder.h"
#include "cohort/comm/Rendezvous.h"
#include "cohort/launch/SlurmRequeue.h"
#include "cohort/train/RankAgreement.h"
#include "cohort/train/Setup.h"
#include "cohort/train/StrategyFactory.h"
#include "cohort/train/TrainingRun.h"
#include "cohort/upload/CheckpointUpload.h"
#include "cohort/util/AtomicFile.h"
#include "cohort/util/Memory.h"
#include "cohort/util/StopSignal.h"

namespace cohort::train {
namespace fs = std::filesystem;

// Note [Leaving a swarm]
// A swarm peer (swarm, diloco) that gets Ctrl-C or SIGTERM leaves between steps: the round it is in
// ends normally (the others do not wait for it), its record says it is leaving (p2p/Directory.h), and
// it saves `last` and writes its summary at once, without the final evaluation. The launcher gives it
// torchrun's 30 s before SIGKILL; a second Ctrl-C kills it at once. Other strategies keep the signals'
// defaults: a worker of a fixed group cannot leave alone, and the launcher stops them all. Which
// strategies leave alone is StrategyTraits::leaves_alone (parallel/Strategy.h).

// The whole job of one worker, top to bottom: setup, resume, the epochs, evaluation, saves, the summary.
TrainResult run_worker(TrainConfig cfg, const comm::WorldInfo& info) {
  if (cfg.train.retain_memory) util::retain_freed_memory();
  // A request for a flight record (SIGUSR2) before there is one must not end the worker; FlightDumps
  // answers it from below on.
  std::signal(SIGUSR2, SIG_IGN);
  comm::World world = join_world(cfg, info);
  const Resume resume = find_resume(cfg, info, world);
  check_same_config(config::to_json(cfg), world);
  const fs::path run_dir = agree_run_dir(cfg, world);
  // From here a failed collective, any error, or SIGUSR2 leaves RUN_DIR/flight/rank<R>.json for `cohort doctor`.
  const comm::FlightDumps flight_dumps(world.comm->flight(), run_dir, info.rank, info.world_size);
  // And `cohort doctor --ask RUN_DIR` finds the job's store here (Note [Asking every rank for its record]).
  if (info.world_size > 1 && info.local_rank == 0) comm::write_store_address(run_dir, info, cfg.dist.backend);
  Job job = set_up_job(cfg, info, world, resume);
  util::catch_preemption_signal();
  if (strategy_traits(cfg, info.rank, info.world_size).leaves_alone) util::catch_stop_signals();
  TrainingRun run(cfg, info, world, job, run_dir, resume);

  job.model->train();
  for (int64_t epoch = run.first_epoch(); run.more(epoch); ++epoch) {
    run.train_epoch(epoch);
    if (run.stopped() || !run.epoch_complete()) continue;
    run.evaluate(epoch);
    if (cfg.ckpt.every_steps == 0 || run.save_due()) run.save_last();
  }
  // A run stopped by train.max_steps still reports a test accuracy and leaves a resumable checkpoint; one
  // stopped by a signal saves at once (Note [Leaving a swarm]).
  if (!run.evaluated_last_step() && !run.stopped()) run.evaluate(run.final_epoch());
  run.save_last();
  const TrainResult result = run.finish();

  world.comm->barrier("end of training")->wait();
  // After the barrier: the other ranks are done and no collective timeout runs while a large checkpoint
  // uploads. See Note [A failed upload keeps the run].
  if (info.rank == 0 && !cfg.ckpt.upload.empty()) {
    auto summary = nlohmann::json::parse(std::ifstream(run_dir / "summary.json"));
    summary["upload"] = upload::upload_checkpoint(cfg, run_dir);
    util::write_file_atomic(run_dir / "summary.json", summary.dump(2) + "\n");
  }
  // Saved, every rank done: now Slurm may stop this job and run it again (Lightning's auto-requeue).
  if (info.rank == 0 && info.launcher == "slurm" && result.stop_signal == SIGUSR1 && cfg.dist.slurm_requeue)
    std::cerr << launch::request_slurm_requeue(info.run_id) << std::endl;
  return result;
}

}  // namespace cohort::train

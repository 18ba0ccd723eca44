// Asks Slurm to run this job again after it stopped for a preemption warning, as Lightning's auto-requeue
// does: the requeued job keeps its id, so it finds runs/slurm-<id> and resumes from its `last` save.
//
//   if (info.launcher == "slurm" && result.stop_signal == SIGUSR1 && info.rank == 0)
//     std::cerr << cohort::launch::request_slurm_requeue(info.run_id) << std::endl;
//
// A job Slurm will not requeue (--no-requeue, JobRequeue=0) gets a warning with scontrol's own words; the
// run stays saved either way.
#pragma once

#include <string>

namespace cohort::launch {

// Runs `scontrol requeue JOB_ID` (no shell) and returns one line for the log saying what happened.
std::string request_slurm_requeue(const std::string& job_id);

}  // namespace cohort::launch

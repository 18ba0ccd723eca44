#include "cohort/launch/SlurmRequeue.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <vector>

extern char** environ;

namespace cohort::launch {
namespace {

// scontrol's exit status and what it printed (stdout and stderr together, first line kept).
std::pair<int, std::string> run_scontrol(const std::string& job_id) {
  int out[2];
  if (pipe(out) != 0) return {-1, "cannot make a pipe"};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDERR_FILENO);
  posix_spawn_file_actions_addclose(&actions, out[0]);
  std::vector<std::string> args{"scontrol", "requeue", job_id};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawnp(&pid, "scontrol", &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(out[1]);
  std::string said;
  char buf[4096];
  for (ssize_t n; (n = read(out[0], buf, sizeof buf)) > 0;) said.append(buf, static_cast<size_t>(n));
  close(out[0]);
  if (rc != 0) return {-1, "scontrol could not be started (is Slurm's client on PATH?)"};
  int status = 0;
  waitpid(pid, &status, 0);
  said = said.substr(0, said.find('\n'));
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, said};
}

}  // namespace

std::string request_slurm_requeue(const std::string& job_id) {
  // The id comes from the environment and goes to argv, not a shell; a non-number is not a job id.
  if (job_id.empty() || !std::all_of(job_id.begin(), job_id.end(), [](unsigned char c) { return std::isdigit(c); }))
    return "cohort: warning: not asking Slurm to requeue: SLURM_JOB_ID is '" + job_id + "', not a job id";
  const auto [status, said] = run_scontrol(job_id);
  if (status == 0)
    return "cohort: asked Slurm to requeue job " + job_id + " (scontrol requeue): it resumes from its last save";
  return "cohort: warning: `scontrol requeue " + job_id + "` failed (" + (said.empty() ? "no output" : said) +
         "): the run is saved; resubmit the job to resume it, or allow requeues (sbatch --requeue)";
}

}  // namespace cohort::launch

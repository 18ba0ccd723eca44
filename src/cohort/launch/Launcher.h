// The local launcher: starts N worker processes of this same binary, watches them, and stops all of
// them as soon as one fails or the user presses Ctrl-C, as torchrun does. Several machines each run
// it with their own node rank and the same master address.
//
//   cohort::launch::LaunchOptions o;
//   o.nproc_per_node = 2;
//   o.worker_argv = {"/proc/self/exe", "train", "train.epochs=1"};
//   int rc = cohort::launch::launch(o);   // 0 when every worker succeeded
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace cohort::launch {

struct LaunchOptions {
  int nproc_per_node = 2;
  int nnodes = 1;
  // Elastic: with --nnodes MIN:MAX, min_nodes = MIN and nnodes = MAX. Each attempt starts with whichever
  // machines (at least MIN) joined the launchers' rendezvous, so after a machine is lost a restart carries
  // on without it. 0: a fixed number of machines.
  int min_nodes = 0;
  // How long the launchers' rendezvous waits for MIN machines (dist.timeout_s).
  double rdzv_timeout_s = 300;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0: a free port on a single machine, 29500 across machines
  std::vector<std::string> worker_argv;
  // Seconds between SIGTERM and SIGKILL when stopping workers after a failure.
  double grace_s = 3.0;
  // The same on Ctrl-C (SIGINT or SIGTERM to the launcher): torchrun's 30 s, for the workers that leave
  // cleanly (a swarm peer finishes its round and saves). A worker that does not catch SIGTERM ends at once.
  double interrupt_grace_s = 30.0;
  // When a worker fails: stop them all and start them all again, up to this many times, with
  // COHORT_RESTART_COUNT=k in their environment (they resume from the run's last checkpoint), as
  // torchrun --max-restarts does. 0: a failure ends the job.
  int max_restarts = 0;
  // Appended to the workers' command line (the launcher fixes run.dir when restarts are on).
  std::vector<std::string> extra_args;
};

// --nnodes as torchrun takes it: N machines, or MIN:MAX for an elastic job (min_nodes = MIN, nnodes =
// MAX). Throws LaunchError naming the spec when it is neither.
void set_nnodes(const std::string& spec, LaunchOptions& o);

// Starts the workers with this process's own command line (the workers recognise their role from
// the environment the launcher gives them).
int launch_with_argv(LaunchOptions options);

// Runs the workers to completion. Returns 0 when all succeeded, 1 when one failed (after stopping the
// others and naming the rank, how it ended and its last error) and no restart was left, 130 on Ctrl-C.
int launch(const LaunchOptions& options);

// Writes the error a worker died of where the launcher (or torchrun) will find it: the file named by
// COHORT_ERROR_FILE or TORCHELASTIC_ERROR_FILE, in torchelastic's JSON layout. Never throws.
void record_worker_error(int rank, const std::string& message);

// Of the workers' error files, the one written first that holds a message: what the launcher prints
// when a worker fails, as torchrun prints its "root cause". The worker that exits first need not be the
// cause: a rank whose collective timed out exits after naming who is missing, and its closed sockets
// make a peer still inside the collective fail with "connection closed", in the same instant.
struct RecordedError {
  int index = -1;  // into `files`; -1 when none holds a message
  std::string message;
};
RecordedError first_recorded_error(const std::vector<std::filesystem::path>& files);

// A port nobody listens on right now, for single-machine jobs (torchrun --standalone does the same).
int find_free_port();

}  // namespace cohort::launch

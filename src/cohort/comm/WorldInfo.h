// Who this process is in the job: rank, world size, local rank, and where rendezvous happens, read from
// whichever launcher started it (cohort's own, torchrun, Slurm or Open MPI).
//
//   auto info = cohort::comm::world_from_env(cohort::comm::current_env());
//   if (info.world_size > 1) { ... rendezvous at info.master_addr:info.master_port ... }
//
// A pure function of the environment, so every launcher convention is unit-tested without processes.
#pragma once

#include <map>
#include <string>

#include "cohort/util/OldNames.h"  // the names of the last release, for programs outside this tree

namespace cohort::comm {

struct WorldInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  int node_rank = 0;
  int nnodes = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // Which attempt this is: TORCHELASTIC_RESTART_COUNT, COHORT_RESTART_COUNT or SLURM_RESTART_COUNT.
  int restart_count = 0;
  // How many restarts the launcher allows (TORCHELASTIC_MAX_RESTARTS), and its name for the job
  // (TORCHELASTIC_RUN_ID: torchrun's --rdzv-id, a fresh uuid under --standalone; SLURM_JOB_ID).
  int max_restarts = 0;
  std::string run_id;
  // torchrun's agent hosts the store (TORCHELASTIC_USE_AGENT_STORE): every rank is a client, keys live
  // under /worker/attempt_<restart_count>.
  bool agent_store = false;
  // "cohort", "torchrun", "slurm", "mpi" or "none" (a single process started by hand).
  std::string launcher = "none";
};

using EnvMap = std::map<std::string, std::string>;

EnvMap current_env();

// Throws LaunchError when the variables are inconsistent (rank >= world size, non-numbers, a missing
// master address under MPI).
WorldInfo world_from_env(const EnvMap& env);

// The first host of a Slurm node list: "node[03-05,9],gpu1" -> "node03".
std::string first_slurm_host(const std::string& nodelist);

}  // namespace cohort::comm

// Faults a test can inject into a real training run through the environment, so the recovery paths run
// in real processes. Read once at the start of a run; the trainer calls the two hooks at their points.
//   COHORT_FAULT_STEP=N            rank COHORT_FAULT_RANK (default 1) kills itself with SIGKILL right
//                                  after step N, in the first attempt only (the restart tests)
//   COHORT_FAULT_SIGNAL            ABRT or SEGV: COHORT_FAULT_STEP's rank aborts (std::abort) or raises
//                                  SIGSEGV instead: a crash (the flight recorder's tests)
//   COHORT_FAULT_USR1_STEP=N       rank COHORT_FAULT_RANK sends itself SIGUSR1 right after step N, in the
//                                  first attempt only: a scheduler's preemption warning that reached one
//                                  rank (the preemption tests)
//   COHORT_FAULT_NONFINITE_STEPS   "3,8": after backward of those steps, rank COHORT_FAULT_RANK's gradient
//                                  gets an inf (odd steps) or a NaN (even steps), as an fp16 overflow would
//   COHORT_FAULT_STEP_DELAY_MS=N   every rank sleeps N ms after each step: a slower machine (the swarm tests
//                                  whose peers must still be training when a newcomer arrives)
//   COHORT_FAULT_RANK_DELAY_MS=N   rank COHORT_FAULT_RANK alone sleeps N ms after each step: a straggler
//   COHORT_FAULT_RANK_SLOWDOWN=F   rank COHORT_FAULT_RANK alone sleeps F times its own step's time (from
//                                  its first batch to its update) after each step: a machine F slower
//                                  (0.3: 30%), whatever the step costs here
//   COHORT_FAULT_DATA_STALL_STEP=N rank COHORT_FAULT_RANK never gets the batch of step N: it sleeps in the
//                                  data phase until it is stopped, as a loader stuck on a dead file system
//                                  (the flight recorder's tests, docs/doctor.md)
//   COHORT_FAULT_BARRIER_STEP=N    rank COHORT_FAULT_RANK enters a checkpoint barrier before the batch of
//                                  step N, which the other ranks do not: a desync (docs/doctor.md)
//   COHORT_FAULT_SKIP_BUCKET=S:B   rank COHORT_FAULT_RANK does not all-reduce ddp's gradient bucket B in its
//                                  process's S-th synchronized backward (step S of a run from step 0): a
//                                  desync (read by parallel/ddp/Reducer.cpp)
//   COHORT_FAULT_SWARM_ROUND=N     a swarm peer sends its contributions to round N (the step N+1), then
//   COHORT_FAULT_SWARM_SIGNAL      raises SIGKILL (KILL, the default) or SIGSTOP (STOP) on itself: a peer
//                                  that dies or freezes mid-round (read by parallel/swarm/SwarmPeer.cpp)
//   COHORT_FAULT_SWARM_DONOR_CHUNKS=N  a swarm peer asked for a chunk of its state after sending N kills
//                                  itself: a donor dying mid-transfer (read by SwarmPeer.cpp too)
//   COHORT_FAULT_SWARM_FIRST_DONOR=HOST:PORT  a newcomer asks this donor first (so a test knows which
//                                  donor it starts with)
//
//   const auto faults = cohort::comm::FaultPlan::from_env();
//   faults.before_batch(rank, step + 1, *world.comm);
//   faults.after_backward(*model, rank, step + 1);
//   faults.after_step(rank, step + 1, info.restart_count);
#pragma once

#include <chrono>
#include <csignal>
#include <cstdint>
#include <set>

#include <torch/nn/module.h>

namespace cohort::comm {

class Communicator;

struct FaultPlan {
  int64_t kill_after_step = 0;  // 0: none
  int kill_signal = SIGKILL;    // SIGABRT or SIGSEGV with COHORT_FAULT_SIGNAL
  int64_t usr1_after_step = 0;  // 0: none
  int rank = 1;
  int64_t step_delay_ms = 0;
  int64_t rank_delay_ms = 0;    // 0: none
  double rank_slowdown = 0;     // 0: none
  int64_t data_stall_step = 0;  // 0: none
  int64_t barrier_step = 0;     // 0: none
  std::set<int64_t> nonfinite_steps;

  static FaultPlan from_env();
  void before_batch(int this_rank, int64_t step, Communicator& comm) const;
  void after_backward(torch::nn::Module& model, int this_rank, int64_t step) const;
  void after_step(int this_rank, int64_t step, int restart_count) const;

 private:
  // COHORT_FAULT_RANK_SLOWDOWN's clock: when the step's first batch began (set by before_batch, which
  // runs for each micro-batch; the hooks are const so that a plan can be passed around by value).
  mutable int64_t timed_step_ = -1;
  mutable std::chrono::steady_clock::time_point step_began_{};
};

// The comma-separated step numbers in environment variable `name` (empty when unset).
std::set<int64_t> fault_steps_from_env(const char* name);

// The first element of the first gradient becomes inf (odd steps) or NaN (even steps).
void poison_gradient(torch::nn::Module& model, int64_t step);

}  // namespace cohort::comm

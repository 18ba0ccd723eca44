// Ctrl-C and SIGTERM as a request to stop at the next step, for a worker that can leave cleanly (a swarm
// peer: it withdraws from matchmaking, finishes its round and saves; Note [Leaving a swarm]), and SIGUSR1,
// the warning a scheduler sends before it preempts a job (Slurm's --signal=USR1@SECONDS), for every worker.
//
//   cohort::util::catch_preemption_signal();      // once, in every worker: SIGUSR1
//   cohort::util::catch_stop_signals();           // once, in a swarm peer: SIGINT and SIGTERM too
//   if (cohort::util::stop_signal() != 0) ...     // between steps: leave
//
// The same signal a second time ends the process at once, as a second Ctrl-C does in Python.
#pragma once

#include <string>

namespace cohort::util {

// Installs the handlers for SIGINT and SIGTERM. Until it is called both keep their defaults: a ddp worker
// that SIGTERM found waiting in a collective for a dead rank must still end at once, as the launchers that
// send it (cohort's, torchrun's, Slurm's scancel) expect.
void catch_stop_signals();
// Installs the handler for SIGUSR1 (default: end the process).
void catch_preemption_signal();
// The first stop signal received (SIGINT, SIGTERM or SIGUSR1), or 0.
int stop_signal();
// "SIGINT", "SIGTERM", "SIGUSR1", or "signal N".
std::string signal_name(int sig);

}  // namespace cohort::util

// Ctrl-C and SIGTERM as a request to stop at the next step, for a worker that can leave cleanly (a swarm
// peer: it withdraws from matchmaking, finishes its round and saves; Note [Leaving a swarm]).
//
//   cohort::util::catch_stop_signals();           // once, in the worker
//   if (cohort::util::stop_signal() != 0) ...     // between steps: leave
//
// The same signal a second time ends the process at once, as a second Ctrl-C does in Python.
#pragma once

#include <string>

namespace cohort::util {

// Installs the handlers for SIGINT and SIGTERM. Until it is called both keep their defaults.
void catch_stop_signals();
// The first stop signal received (SIGINT or SIGTERM), or 0.
int stop_signal();
// "SIGINT", "SIGTERM", or "signal N".
std::string signal_name(int sig);

}  // namespace cohort::util

#include "cohort/util/StopSignal.h"

#include <csignal>

namespace cohort::util {
namespace {

volatile std::sig_atomic_t g_stop = 0;

void on_stop(int sig) {
  // The same signal again (a second Ctrl-C): the user does not want to wait for the round and the save.
  // The other one does not count: a Ctrl-C reaches the workers from the terminal and from the launcher,
  // which forwards it as SIGTERM.
  if (g_stop == sig) {
    std::signal(sig, SIG_DFL);
    std::raise(sig);
    return;
  }
  if (g_stop == 0) g_stop = sig;
}

void catch_signal(int sig) {
  struct sigaction sa {};
  sa.sa_handler = on_stop;
  sigemptyset(&sa.sa_mask);
  sigaction(sig, &sa, nullptr);
}

}  // namespace

void catch_stop_signals() {
  catch_signal(SIGINT);
  catch_signal(SIGTERM);
}

void catch_preemption_signal() { catch_signal(SIGUSR1); }

int stop_signal() { return g_stop; }

std::string signal_name(int sig) {
  if (sig == SIGINT) return "SIGINT";
  if (sig == SIGTERM) return "SIGTERM";
  if (sig == SIGUSR1) return "SIGUSR1";
  return "signal " + std::to_string(sig);
}

}  // namespace cohort::util

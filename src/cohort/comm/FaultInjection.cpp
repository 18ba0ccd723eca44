#include "cohort/comm/FaultInjection.h"

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>

#include "cohort/comm/Communicator.h"

namespace cohort::comm {

FaultPlan FaultPlan::from_env() {
  FaultPlan plan;
  if (const char* step = std::getenv("COHORT_FAULT_STEP")) plan.kill_after_step = std::atoll(step);
  if (const char* sig = std::getenv("COHORT_FAULT_SIGNAL")) {
    const std::string name = sig;
    plan.kill_signal = name == "ABRT" ? SIGABRT : name == "SEGV" ? SIGSEGV : name == "KILL" ? SIGKILL : 0;
    if (plan.kill_signal == 0)
      throw std::invalid_argument("COHORT_FAULT_SIGNAL=" + name + ": a test's fault is KILL, ABRT or SEGV");
  }
  if (const char* step = std::getenv("COHORT_FAULT_USR1_STEP")) plan.usr1_after_step = std::atoll(step);
  if (const char* rank = std::getenv("COHORT_FAULT_RANK")) plan.rank = std::atoi(rank);
  plan.nonfinite_steps = fault_steps_from_env("COHORT_FAULT_NONFINITE_STEPS");
  if (const char* delay = std::getenv("COHORT_FAULT_STEP_DELAY_MS")) plan.step_delay_ms = std::atoll(delay);
  if (const char* delay = std::getenv("COHORT_FAULT_RANK_DELAY_MS")) plan.rank_delay_ms = std::atoll(delay);
  if (const char* f = std::getenv("COHORT_FAULT_RANK_SLOWDOWN")) {
    plan.rank_slowdown = std::atof(f);
    if (!(plan.rank_slowdown >= 0 && plan.rank_slowdown <= 100))
      throw std::invalid_argument(std::string("COHORT_FAULT_RANK_SLOWDOWN=") + f +
                                  ": a test's slowdown is a fraction of the step, 0.3 for 30%");
  }
  if (const char* step = std::getenv("COHORT_FAULT_DATA_STALL_STEP")) plan.data_stall_step = std::atoll(step);
  if (const char* step = std::getenv("COHORT_FAULT_BARRIER_STEP")) plan.barrier_step = std::atoll(step);
  return plan;
}

void FaultPlan::before_batch(int this_rank, int64_t step, Communicator& comm) const {
  if (rank_slowdown > 0 && this_rank == rank && step != timed_step_) {
    timed_step_ = step;
    step_began_ = std::chrono::steady_clock::now();
  }
  if (barrier_step > 0 && step == barrier_step && this_rank == rank)
    comm.barrier("checkpoint step-" + std::to_string(step) + ": begin (COHORT_FAULT_BARRIER_STEP)")->wait();
  if (data_stall_step > 0 && step == data_stall_step && this_rank == rank)
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));  // until SIGTERM or SIGKILL
}

void FaultPlan::after_backward(torch::nn::Module& model, int this_rank, int64_t step) const {
  if (this_rank == rank && nonfinite_steps.count(step)) poison_gradient(model, step);
}

void FaultPlan::after_step(int this_rank, int64_t step, int restart_count) const {
  if (kill_after_step > 0 && restart_count == 0 && step == kill_after_step && this_rank == rank) {
    if (kill_signal == SIGABRT) std::abort();  // as a failed assertion or std::terminate does
    ::raise(kill_signal);
  }
  if (usr1_after_step > 0 && restart_count == 0 && step == usr1_after_step && this_rank == rank) ::raise(SIGUSR1);
  if (step_delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(step_delay_ms));
  if (rank_delay_ms > 0 && this_rank == rank) std::this_thread::sleep_for(std::chrono::milliseconds(rank_delay_ms));
  if (rank_slowdown > 0 && this_rank == rank && step == timed_step_)
    std::this_thread::sleep_for((std::chrono::steady_clock::now() - step_began_) * rank_slowdown);
}

std::set<int64_t> fault_steps_from_env(const char* name) {
  std::set<int64_t> out;
  const char* text = std::getenv(name);
  if (!text) return out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) out.insert(std::atoll(item.c_str()));
  return out;
}

void poison_gradient(torch::nn::Module& model, int64_t step) {
  at::NoGradGuard no_grad;
  for (auto& p : model.parameters())
    if (p.grad().defined()) {
      p.grad().view(-1)[0].fill_(step % 2 ? std::numeric_limits<double>::infinity() : std::nan(""));
      return;
    }
}

}  // namespace cohort::comm

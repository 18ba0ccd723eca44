// Starts real `cohort` processes for the process tests: output captured to a file, a wall-clock limit
// per run, and the whole process group killed on timeout so a hung test never leaves workers behind.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace cohort::testing {

struct ProcResult {
  int exit_code = -1;  // -1 when killed by a signal
  int term_signal = 0;
  bool timed_out = false;
  double seconds = 0;
  std::string output;  // stdout and stderr together
};

// A started process whose output goes to a file; wait() reaps it.
class Proc {
 public:
  Proc(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env = {});
  ~Proc();
  pid_t pid() const { return pid_; }
  ProcResult wait(double timeout_s);
  std::string output_so_far() const;

 private:
  pid_t pid_ = -1;
  std::filesystem::path log_;
  bool reaped_ = false;
};

ProcResult run(const std::vector<std::string>& argv, double timeout_s,
               const std::map<std::string, std::string>& env = {});

// `cohort ARGS...` (any subcommand: report, eval, find-batch-size).
ProcResult run_cohort(const std::vector<std::string>& args, double timeout_s = 240);
// A whole file as bytes ("" when it cannot be read).
std::string read_file(const std::filesystem::path& p);

// `cohort train` with the given arguments.
ProcResult cohort_train(const std::vector<std::string>& args, double timeout_s = 240,
                        const std::map<std::string, std::string>& env = {});
std::vector<std::string> cohort_argv(const std::vector<std::string>& args);

std::filesystem::path fresh_dir(const std::string& name);
nlohmann::json read_json(const std::filesystem::path& p);
// Each step's training loss from a run's metrics.jsonl; a resumed or restarted run may log a step twice,
// and the later record is the one that counts.
std::map<int64_t, double> losses_by_step(const std::filesystem::path& run_dir);
// The losses of the steps after `from_step`, in step order.
std::vector<double> step_losses(const std::filesystem::path& run_dir, int64_t from_step);
std::vector<nlohmann::json> read_jsonl(const std::filesystem::path& p);
// Child pids of `pid` (from /proc), for checking that no worker outlives its launcher.
std::vector<pid_t> children_of(pid_t pid);
bool process_exists(pid_t pid);

// Small, fast settings shared by the process tests: a slice of Fashion-MNIST and a tiny model, in fp32
// and the contiguous layout (amp.precision and train.channels_last pinned, not auto).
std::vector<std::string> quick_args(const std::filesystem::path& run_dir, std::vector<std::string> extra = {});

}  // namespace cohort::testing

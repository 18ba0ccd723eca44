#include "cohort/commands/BatchSizeFinder.h"

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "cohort/launch/Launcher.h"
#include "cohort/util/Error.h"

namespace cohort::commands {
namespace fs = std::filesystem;

namespace {

std::string gib(int64_t bytes) {
  std::ostringstream os;
  os.precision(3);
  os << static_cast<double>(bytes) / double(1 << 30) << " GiB";
  return os.str();
}

// VmRSS of another process, from /proc/<pid>/status (0 once it is gone).
int64_t rss_of(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  return 0;
}

std::string tail_of(const fs::path& log, size_t max_chars) {
  std::ifstream in(log);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return all.size() > max_chars ? "..." + all.substr(all.size() - max_chars) : all;
}

bool contains(const std::string& s, const char* what) { return s.find(what) != std::string::npos; }

}  // namespace

FindResult find_batch_size(const FindOptions& o, const std::function<Trial(int64_t)>& run) {
  FindResult r;
  int64_t fit = 0;     // the largest batch seen to fit
  int64_t no_fit = 0;  // the smallest batch seen not to fit (0: none yet)
  int64_t b = std::clamp<int64_t>(o.start, 1, o.max_batch);
  for (int trial = 0; trial < o.max_trials; ++trial) {
    Trial t = run(b);
    r.trials.push_back(t);
    if (t.fits) {
      fit = std::max(fit, b);
    } else {
      no_fit = no_fit == 0 ? b : std::min(no_fit, b);
      r.limited_by = t.dataset_limit ? "dataset" : "memory";
    }
    if (no_fit == 0) {  // still doubling
      if (b >= o.max_batch) {
        r.limited_by = "max_batch";
        break;
      }
      b = std::min(b * 2, o.max_batch);
      continue;
    }
    if (no_fit - fit <= 1) break;  // converged: fit + 1 does not fit
    b = fit + (no_fit - fit) / 2;
  }
  const bool converged = (no_fit != 0 && no_fit - fit <= 1) || r.limited_by == "max_batch";
  if (!converged) r.limited_by = "max_trials";
  r.batch_size = fit;
  return r;
}

Trial run_trial(const FindOptions& o, int64_t batch) {
  Trial t;
  t.batch = batch;
  const fs::path dir = o.work_dir / ("trial-" + std::to_string(batch));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path log = dir / "output.txt";

  std::vector<std::string> args = {o.binary, "train"};
  args.insert(args.end(), o.train_args.begin(), o.train_args.end());
  // Later overrides win: the trial trains `steps` steps and writes nothing a user would keep.
  for (const std::string& kv :
       {"data.batch_size=" + std::to_string(batch), "train.max_steps=" + std::to_string(o.steps),
        std::string("train.resume="), std::string("eval.enabled=false"), std::string("ckpt.save_best=false"),
        std::string("ckpt.upload="), std::string("log.tensorboard=false"), std::string("log.monitor_s=0"),
        std::string("log.progress=off"), "run.dir=" + (dir / "run").string()})
    args.push_back(kv);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const std::string port = std::to_string(launch::find_free_port());

  const auto start = std::chrono::steady_clock::now();
  const pid_t pid = fork();
  if (pid < 0) throw Error(std::string("find-batch-size: fork failed: ") + std::strerror(errno));
  if (pid == 0) {
    // One worker, in the environment torchrun would give it.
    setenv("RANK", "0", 1);
    setenv("WORLD_SIZE", "1", 1);
    setenv("LOCAL_RANK", "0", 1);
    setenv("LOCAL_WORLD_SIZE", "1", 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", port.c_str(), 1);
    setenv("COHORT_LAUNCHER", "find-batch-size", 1);
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    execv(argv[0], argv.data());
    _exit(127);
  }

  bool over_budget = false, timed_out = false;
  int64_t seen_rss = 0;
  int status = 0;
  rusage ru{};
  for (;;) {
    const pid_t done = wait4(pid, &status, WNOHANG, &ru);
    if (done == pid) break;
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    seen_rss = std::max(seen_rss, rss_of(pid));
    if (!over_budget && !timed_out && o.max_memory > 0 && seen_rss > o.max_memory) {
      over_budget = true;
      kill(pid, SIGKILL);
    }
    if (!over_budget && !timed_out && elapsed > o.trial_timeout_s) {
      timed_out = true;
      kill(pid, SIGKILL);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  t.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  t.peak_rss = std::max<int64_t>(seen_rss, static_cast<int64_t>(ru.ru_maxrss) * 1024);
  const std::string output = tail_of(log, 2000);
  if (timed_out)
    throw Error("find-batch-size: the trial with data.batch_size=" + std::to_string(batch) + " ran longer than " +
                    std::to_string(int(o.trial_timeout_s)) + " s; its output:\n" + output,
                "use a smaller model or fewer --steps");
  const bool clean_exit = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  if (over_budget || (clean_exit && o.max_memory > 0 && t.peak_rss > o.max_memory)) {
    t.why = "peak RSS " + gib(t.peak_rss) + " > budget " + gib(o.max_memory);
  } else if (clean_exit) {
    t.fits = true;
  } else if (contains(output, "out of memory") || contains(output, "bad_alloc") ||
             contains(output, "can't allocate memory") || contains(output, "Cannot allocate memory")) {
    t.why = "out of memory";
  } else if (contains(output, "exceeds this rank's")) {
    t.why = "larger than the training set";
    t.dataset_limit = true;
  } else if (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) {
    t.why = "killed by SIGKILL (the kernel's out-of-memory killer?)";
  } else {
    throw Error("find-batch-size: the trial with data.batch_size=" + std::to_string(batch) +
                    " failed for a reason other than memory; its output:\n" + output,
                "run the same config with `cohort train` to see the problem");
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
  return t;
}

nlohmann::json to_json(const FindResult& r, const FindOptions& o) {
  nlohmann::json trials = nlohmann::json::array();
  for (const auto& t : r.trials) {
    nlohmann::json j = {
        {"batch_size", t.batch}, {"fits", t.fits}, {"peak_rss_bytes", t.peak_rss}, {"seconds", t.seconds}};
    if (!t.why.empty()) j["why"] = t.why;
    trials.push_back(j);
  }
  return {{"batch_size", r.batch_size},
          {"limited_by", r.limited_by},
          {"max_memory_bytes", o.max_memory},
          {"device", "cpu"},
          {"steps_per_trial", o.steps},
          {"train_args", o.train_args},
          {"trials", trials},
          {"time", std::time(nullptr)}};
}

int64_t parse_bytes(const std::string& text) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::string unit = text.substr(used);
  std::transform(unit.begin(), unit.end(), unit.begin(), [](unsigned char c) { return std::toupper(c); });
  for (const char* suffix : {"IB", "B"})
    if (unit.size() > std::strlen(suffix) &&
        unit.compare(unit.size() - std::strlen(suffix), std::string::npos, suffix) == 0) {
      unit.resize(unit.size() - std::strlen(suffix));
      break;
    }
  double mult = 0;
  if (unit.empty() || unit == "B")
    mult = 1;
  else if (unit == "K")
    mult = 1024.0;
  else if (unit == "M")
    mult = 1024.0 * 1024;
  else if (unit == "G")
    mult = 1024.0 * 1024 * 1024;
  else if (unit == "T")
    mult = 1024.0 * 1024 * 1024 * 1024;
  if (used == 0 || mult == 0 || !(v > 0) || !std::isfinite(v))
    throw ConfigError("'" + text + "' is not a memory size", "write it as 4G, 512M or a number of bytes");
  return static_cast<int64_t>(v * mult);
}

int64_t available_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("MemAvailable:", 0) == 0) return std::stoll(line.substr(13)) * 1024;
  return 0;
}

}  // namespace cohort::commands

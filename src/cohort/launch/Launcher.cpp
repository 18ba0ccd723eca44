// Over 450 lines on purpose: the launcher's one job, start N workers and watch them (spawning, signals,
// restarts), in short functions that share its worker table. The launchers' own rendezvous of an elastic
// job is ElasticRendezvous.h's (Note [Elastic rendezvous of launchers]).
#include "cohort/launch/Launcher.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "cohort/comm/Rendezvous.h"
#include "cohort/launch/ElasticRendezvous.h"
#include "cohort/store/AuthStore.h"
#include "cohort/util/Error.h"

namespace cohort::launch {
namespace fs = std::filesystem;
namespace {

volatile std::sig_atomic_t g_interrupted = 0;
volatile std::sig_atomic_t g_interrupts = 0;  // a second Ctrl-C stops waiting for the workers
void on_signal(int sig) {
  g_interrupted = sig;
  g_interrupts = g_interrupts + 1;
}
// SIGUSR2 to the launcher asks its workers for their flight records (docs/doctor.md): one signal a machine
// asks every rank there, without looking up the workers' pids.
volatile std::sig_atomic_t g_flight_asked = 0;
void on_sigusr2(int) { g_flight_asked = 1; }

struct Worker {
  int rank = 0;
  int local_rank = 0;
  pid_t pid = -1;
  bool running = false;
  int status = 0;
  fs::path error_file;
};

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* name = sigabbrev_np(sig);
    return "was killed by signal " + std::to_string(sig) + " (SIG" + (name ? name : "?") + ")";
  }
  return "ended with status " + std::to_string(status);
}

std::string read_error(const fs::path& file) {
  std::ifstream in(file);
  if (!in) return {};
  try {
    const auto j = nlohmann::json::parse(in);
    return j.at("message").at("message").get<std::string>();
  } catch (const std::exception&) {
    return {};
  }
}

pid_t spawn(const LaunchOptions& o, Worker& w, int world_size, int port, int restart, const std::string& secret) {
  std::vector<std::string> env_kv = {
      "COHORT_RESTART_COUNT=" + std::to_string(restart),
      "RANK=" + std::to_string(w.rank),
      "LOCAL_RANK=" + std::to_string(w.local_rank),
      "WORLD_SIZE=" + std::to_string(world_size),
      "LOCAL_WORLD_SIZE=" + std::to_string(o.nproc_per_node),
      "GROUP_RANK=" + std::to_string(o.node_rank),
      "COHORT_NODE_RANK=" + std::to_string(o.node_rank),
      "COHORT_NNODES=" + std::to_string(o.nnodes),
      "MASTER_ADDR=" + o.master_addr,
      "MASTER_PORT=" + std::to_string(port),
      "COHORT_LAUNCHER=1",
      "COHORT_ERROR_FILE=" + w.error_file.string(),
      "TORCHELASTIC_ERROR_FILE=" + w.error_file.string(),
  };
  if (!secret.empty()) env_kv.push_back("COHORT_TOKEN=" + secret);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) throw LaunchError(std::string("cannot start a worker: fork failed: ") + std::strerror(errno));
  if (pid > 0) return pid;
  // Child. If the launcher dies, even by SIGKILL, the kernel kills the worker: never an orphan.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(1);
  signal(SIGINT, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
  for (const auto& kv : env_kv) putenv(strdup(kv.c_str()));
  std::vector<char*> argv;
  for (const auto& a : o.worker_argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  // Exec the resolved path rather than /proc/self/exe so `ps` shows the workers as cohort.
  std::error_code ec;
  const auto self = fs::read_symlink("/proc/self/exe", ec);
  execv(ec ? "/proc/self/exe" : self.c_str(), argv.data());
  std::fprintf(stderr, "cohort: cannot exec worker: %s\n", std::strerror(errno));
  _exit(127);
}

void signal_all(std::vector<Worker>& workers, int sig) {
  for (auto& w : workers)
    if (w.running) kill(w.pid, sig);
}

// Reaps whatever has exited; returns the index of the first worker that failed this round, or -1.
int reap(std::vector<Worker>& workers) {
  int failed = -1;
  for (size_t i = 0; i < workers.size(); ++i) {
    auto& w = workers[i];
    if (!w.running) continue;
    int status = 0;
    const pid_t r = waitpid(w.pid, &status, WNOHANG);
    if (r == w.pid) {
      w.running = false;
      w.status = status;
      if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0) && failed < 0) failed = static_cast<int>(i);
    }
  }
  return failed;
}

bool any_running(const std::vector<Worker>& workers) {
  for (const auto& w : workers)
    if (w.running) return true;
  return false;
}

// Before the others are stopped for a failure, each is asked for its flight record (SIGUSR2: a watcher
// thread in the worker writes RUN_DIR/flight/rank<R>.json, comm/FlightRecorder.h), so that `cohort doctor`
// sees what every rank was doing, not only the one that failed. A rank stopped or frozen cannot answer;
// its missing record names it. A second is ten times what a record takes to write.
void ask_for_flight_records(std::vector<Worker>& workers) {
  if (!any_running(workers)) return;
  signal_all(workers, SIGUSR2);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (any_running(workers) && std::chrono::steady_clock::now() < deadline) {
    reap(workers);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void stop_all(std::vector<Worker>& workers, double grace_s) {
  signal_all(workers, SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(grace_s);
  const int interrupts = g_interrupts;
  while (any_running(workers) && std::chrono::steady_clock::now() < deadline && g_interrupts == interrupts) {
    reap(workers);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  signal_all(workers, SIGKILL);
  for (auto& w : workers) {
    if (!w.running) continue;
    waitpid(w.pid, &w.status, 0);
    w.running = false;
  }
}

}  // namespace

int find_free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw LaunchError(std::string("cannot open a socket to find a free port: ") + std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(fd);
    throw LaunchError(std::string("cannot find a free port: ") + std::strerror(errno), "pass --master-port");
  }
  close(fd);
  return ntohs(addr.sin_port);
}

void record_worker_error(int rank, const std::string& message) {
  const char* path = std::getenv("COHORT_ERROR_FILE");
  if (!path || !*path) path = std::getenv("TORCHELASTIC_ERROR_FILE");
  if (!path || !*path) return;
  // torchelastic's layout, so torchrun shows the message too.
  nlohmann::json j = {
      {"message",
       {{"message", message}, {"extraInfo", {{"rank", rank}, {"timestamp", std::to_string(std::time(nullptr))}}}}}};
  std::ofstream out(path);
  out << j.dump() << '\n';
}

// By modification time, which has nanosecond resolution; torchelastic's "timestamp" field has seconds.
RecordedError first_recorded_error(const std::vector<fs::path>& files) {
  RecordedError first;
  fs::file_time_type when = fs::file_time_type::max();
  for (size_t i = 0; i < files.size(); ++i) {
    std::error_code ec;
    const auto t = fs::last_write_time(files[i], ec);
    if (ec || t >= when) continue;
    if (auto msg = read_error(files[i]); !msg.empty()) {
      when = t;
      first = {static_cast<int>(i), std::move(msg)};
    }
  }
  return first;
}

void set_nnodes(const std::string& spec, LaunchOptions& o) {
  const auto number = [&](const std::string& text) {
    size_t used = 0;
    int n = 0;
    try {
      n = std::stoi(text, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    return used == text.size() && used > 0 ? n : -1;
  };
  if (const auto colon = spec.find(':'); colon != std::string::npos) {
    const int lo = number(spec.substr(0, colon)), hi = number(spec.substr(colon + 1));
    if (lo < 1 || hi < lo)
      throw LaunchError("--nnodes " + spec + " is not MIN:MAX with 1 <= MIN <= MAX", "for example --nnodes 2:3");
    o.min_nodes = lo;
    o.nnodes = hi;
    return;
  }
  o.nnodes = number(spec);
  if (o.nnodes < 1)
    throw LaunchError("--nnodes " + spec + " is not a number of machines", "pass --nnodes 2, or --nnodes MIN:MAX");
}

int launch_with_argv(LaunchOptions options) {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string arg;
  options.worker_argv.clear();
  while (std::getline(in, arg, '\0')) options.worker_argv.push_back(arg);
  options.worker_argv.insert(options.worker_argv.end(), options.extra_args.begin(), options.extra_args.end());
  return launch(options);
}

namespace {

// Waits for this attempt's workers: 0 when all end well; 1 when one fails or another machine's does
// (the rest are stopped and the first recorded error is named); 130 on Ctrl-C.
int watch(std::vector<Worker>& workers, const LaunchOptions& o, ElasticRendezvous* rdzv, int attempt) {
  while (any_running(workers)) {
    if (g_flight_asked) {
      g_flight_asked = 0;
      signal_all(workers, SIGUSR2);
      std::cerr << "cohort: asked " << workers.size() << " worker(s) for their flight records (RUN_DIR/flight/)"
                << std::endl;
    }
    if (g_interrupted) {
      std::cerr << "cohort: interrupted; stopping " << workers.size() << " worker(s) (a swarm peer finishes its round "
                << "and saves; Ctrl-C again to kill them now)" << std::endl;
      stop_all(workers, o.interrupt_grace_s);
      if (rdzv) rdzv->mark_failed(attempt, "node " + std::to_string(o.node_rank) + " was interrupted");
      return 130;
    }
    const int failed = reap(workers);
    if (failed >= 0) {
      const auto& w = workers[failed];
      int others = 0;
      for (const auto& x : workers) others += x.running ? 1 : 0;
      std::cerr << "cohort: worker rank " << w.rank << " (local rank " << w.local_rank << ", pid " << w.pid << ") "
                << describe_status(w.status) << "; stopping the other " << others << " local worker(s)" << std::endl;
      ask_for_flight_records(workers);
      stop_all(workers, o.grace_s);
      std::vector<fs::path> files;
      for (const auto& x : workers) files.push_back(x.error_file);
      if (const auto first = first_recorded_error(files); first.index >= 0) {
        const int rank = workers[first.index].rank;
        std::cerr << "cohort: rank " << rank << "'s last error" << (rank == w.rank ? "" : " (the first recorded here)")
                  << ": " << first.message << std::endl;
      }
      if (rdzv) rdzv->mark_failed(attempt, "worker rank " + std::to_string(w.rank) + " " + describe_status(w.status));
      return 1;
    }
    if (rdzv) {
      if (const auto why = rdzv->failed_elsewhere(attempt); !why.empty()) {
        std::cerr << "cohort: another machine failed (" << why << "); stopping " << workers.size() << " local worker(s)"
                  << std::endl;
        ask_for_flight_records(workers);
        stop_all(workers, o.grace_s);
        return 1;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return 0;
}

// Starts this machine's workers for one attempt; each records its last error in `error_dir`.
std::vector<Worker> start_workers(const LaunchOptions& now, const fs::path& error_dir, int world_size, int port,
                                  int attempt, const std::string& generated_secret) {
  std::vector<Worker> workers(now.nproc_per_node);
  for (int i = 0; i < now.nproc_per_node; ++i) {
    auto& w = workers[i];
    w.local_rank = i;
    w.rank = now.node_rank * now.nproc_per_node + i;
    w.error_file = error_dir / ("rank" + std::to_string(w.rank) + ".json");
    std::error_code ec;
    fs::remove(w.error_file, ec);
    w.pid = spawn(now, w, world_size, port, attempt, generated_secret);
    w.running = true;
  }
  return workers;
}

// Every job's store demands a secret (Note [Store handshake]). On one machine the launcher starts every
// worker, so it can make one up (returned); across machines the user must give the same one to every
// launcher (returns "": the environment's is used).
std::string generated_secret_for(const LaunchOptions& o) {
  if (!store::secret_from_env().empty()) return "";
  if (o.nnodes == 1) return store::random_secret();
  if (!comm::is_loopback(o.master_addr))
    throw LaunchError("a multi-machine job needs a shared secret for its rendezvous store (--master-addr " +
                          o.master_addr + " is reachable from other machines)",
                      "pass --token-file FILE (the same file, mode 600, on every machine; `openssl rand -hex 32 > "
                      "FILE`), or set COHORT_TOKEN on every machine");
  return "";
}

}  // namespace

int launch(const LaunchOptions& o) {
  if (o.nproc_per_node < 1) throw LaunchError("--nproc-per-node must be at least 1", "pass --nproc-per-node 2");
  if (o.nnodes < 1 || o.node_rank < 0 || o.node_rank >= o.nnodes)
    throw LaunchError(
        "--node-rank " + std::to_string(o.node_rank) + " is not in [0, --nnodes " + std::to_string(o.nnodes) + ")",
        "number machines 0..nnodes-1, each with its own --node-rank");

  const std::string generated_secret = generated_secret_for(o);

  char tmpl[] = "/tmp/cohort-launch-XXXXXX";
  const char* tmp = mkdtemp(tmpl);
  if (!tmp) throw LaunchError(std::string("cannot create a temporary directory: ") + std::strerror(errno));
  const fs::path error_dir(tmp);

  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  struct sigaction old_int {
  }, old_term{}, old_usr2{};
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  struct sigaction usr2 = sa;
  usr2.sa_handler = on_sigusr2;
  sigaction(SIGUSR2, &usr2, &old_usr2);

  // The secret the workers get: the one given to the launcher, else the one it made up.
  const std::string secret = generated_secret.empty() ? store::secret_from_env() : generated_secret;
  // The launchers' rendezvous runs for an elastic job, and for any multi-machine job with restarts: a
  // failure on one machine then restarts the workers on every machine together, in the same round.
  const bool elastic = (o.min_nodes > 0 && o.min_nodes < o.nnodes) || (o.nnodes > 1 && o.max_restarts > 0);
  LaunchOptions base = o;
  if (elastic && base.master_port == 0) base.master_port = 29500;
  if (elastic && base.min_nodes <= 0) base.min_nodes = base.nnodes;
  std::unique_ptr<ElasticRendezvous> rdzv;
  if (elastic) rdzv = std::make_unique<ElasticRendezvous>(base, secret);

  int rc = 0;
  for (int attempt = 0;; ++attempt) {
    // This attempt's machines: fixed, or whoever joined the launchers' rendezvous.
    LaunchOptions now = o;
    if (rdzv) {
      const auto m = rdzv->join(attempt);
      now.nnodes = m.nnodes;
      now.node_rank = m.node_rank;
      if (m.node_rank == 0) {
        std::string list;
        for (int n : m.original) list += (list.empty() ? "" : ", ") + std::to_string(n);
        std::cerr << "cohort: round " << attempt << ": " << m.nnodes << " machine(s) (--node-rank " << list << "), "
                  << m.nnodes * o.nproc_per_node << " workers" << std::endl;
      }
    }
    const int world_size = now.nnodes * o.nproc_per_node;
    // A fresh port per attempt on one machine (the last store's may linger in TIME_WAIT); across machines
    // the agreed one, so every node's launcher meets again at the same address.
    const int port = rdzv                ? base.master_port + 1
                     : o.master_port > 0 ? o.master_port
                                         : (o.nnodes == 1 ? find_free_port() : 29500);
    auto workers = start_workers(now, error_dir, world_size, port, attempt, generated_secret);
    rc = watch(workers, o, rdzv.get(), attempt);
    if (rc == 0 && rdzv) rdzv->finish(attempt, now.nnodes);
    if (rc != 1 || attempt >= o.max_restarts) {
      if (rc == 1 && o.max_restarts > 0)
        std::cerr << "cohort: no restart left (--max-restarts " << o.max_restarts << " used up)" << std::endl;
      break;
    }
    std::cerr << "cohort: restarting all " << o.nproc_per_node << " local worker(s) (restart " << attempt + 1 << " of "
              << o.max_restarts << "); they resume from the last checkpoint" << std::endl;
  }
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  sigaction(SIGUSR2, &old_usr2, nullptr);
  std::error_code ec;
  fs::remove_all(error_dir, ec);
  return rc;
}

}  // namespace cohort::launch

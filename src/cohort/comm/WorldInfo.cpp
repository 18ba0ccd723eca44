#include "cohort/comm/WorldInfo.h"

#include <cstdlib>

#include "cohort/util/Error.h"

extern char** environ;

namespace cohort::comm {
namespace {

const std::string* lookup(const EnvMap& env, const std::string& key) {
  auto it = env.find(key);
  return it == env.end() || it->second.empty() ? nullptr : &it->second;
}

int to_int(const EnvMap& env, const std::string& key, int fallback) {
  const auto* v = lookup(env, key);
  if (!v) return fallback;
  char* end = nullptr;
  const long n = std::strtol(v->c_str(), &end, 10);
  if (*end != '\0' || n < 0 || n > 1'000'000)
    throw LaunchError("environment variable " + key + "='" + *v + "' is not a valid non-negative integer",
                      "fix the launcher's environment, or unset it to run a single process");
  return static_cast<int>(n);
}

std::string str(const EnvMap& env, const std::string& key, const std::string& fallback) {
  const auto* v = lookup(env, key);
  return v ? *v : fallback;
}

void check(const WorldInfo& w, const std::string& source) {
  if (w.world_size < 1 || w.rank >= w.world_size)
    throw LaunchError(
        source + ": rank " + std::to_string(w.rank) + " is not below world size " + std::to_string(w.world_size),
        "the launcher's rank and world-size variables disagree");
  if (w.local_world_size < 1 || w.local_rank >= w.local_world_size)
    throw LaunchError(source + ": local rank " + std::to_string(w.local_rank) + " is not below local world size " +
                          std::to_string(w.local_world_size),
                      "the launcher's local rank variables disagree");
  if (w.master_port < 1 || w.master_port > 65535)
    throw LaunchError(source + ": master port " + std::to_string(w.master_port) + " is out of range",
                      "use a port in 1..65535");
}

}  // namespace

EnvMap current_env() {
  EnvMap env;
  for (char** e = environ; e && *e; ++e) {
    std::string kv(*e);
    const auto eq = kv.find('=');
    if (eq != std::string::npos) env.emplace(kv.substr(0, eq), kv.substr(eq + 1));
  }
  return env;
}

std::string first_slurm_host(const std::string& nodelist) {
  // Take the first comma-separated entry outside brackets, then expand only its first range element.
  std::string first;
  int depth = 0;
  for (char c : nodelist) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (c == ',' && depth == 0) break;
    first += c;
  }
  const auto lb = first.find('[');
  if (lb == std::string::npos) return first;
  std::string inside = first.substr(lb + 1, first.find(']') - lb - 1);
  inside = inside.substr(0, inside.find(','));
  inside = inside.substr(0, inside.find('-'));
  return first.substr(0, lb) + inside;
}

WorldInfo world_from_env(const EnvMap& env) {
  WorldInfo w;
  if (lookup(env, "RANK") && lookup(env, "WORLD_SIZE")) {
    // cohort's own launcher and torchrun use the same variables; cohort's adds COHORT_LAUNCHER.
    w.launcher = lookup(env, "COHORT_LAUNCHER") ? "cohort" : (lookup(env, "TORCHELASTIC_RUN_ID") ? "torchrun" : "env");
    w.rank = to_int(env, "RANK", 0);
    w.world_size = to_int(env, "WORLD_SIZE", 1);
    w.local_rank = to_int(env, "LOCAL_RANK", 0);
    w.local_world_size = to_int(env, "LOCAL_WORLD_SIZE", w.local_rank + 1);
    w.node_rank = to_int(env, "GROUP_RANK", to_int(env, "COHORT_NODE_RANK", 0));
    w.nnodes = to_int(env, "COHORT_NNODES", (w.world_size + w.local_world_size - 1) / w.local_world_size);
    w.master_addr = str(env, "MASTER_ADDR", "127.0.0.1");
    w.master_port = to_int(env, "MASTER_PORT", 29500);
    w.restart_count = to_int(env, "TORCHELASTIC_RESTART_COUNT", to_int(env, "COHORT_RESTART_COUNT", 0));
    w.max_restarts = to_int(env, "TORCHELASTIC_MAX_RESTARTS", 0);
    w.run_id = str(env, "TORCHELASTIC_RUN_ID", "");
    const std::string agent = str(env, "TORCHELASTIC_USE_AGENT_STORE", "");
    w.agent_store = agent == "True" || agent == "true" || agent == "1";
    check(w, w.launcher == "torchrun" ? "torchrun environment" : "RANK/WORLD_SIZE environment");
    return w;
  }
  if (lookup(env, "SLURM_PROCID") && lookup(env, "SLURM_NTASKS")) {
    w.launcher = "slurm";
    w.rank = to_int(env, "SLURM_PROCID", 0);
    w.world_size = to_int(env, "SLURM_NTASKS", 1);
    w.local_rank = to_int(env, "SLURM_LOCALID", 0);
    // SLURM_NTASKS_PER_NODE can be "4(x2)"; the leading number is this node's count.
    w.local_world_size = to_int(env, "SLURM_NTASKS_PER_NODE_INT", 0);
    if (w.local_world_size == 0) {
      const std::string per = str(env, "SLURM_NTASKS_PER_NODE", "");
      w.local_world_size = per.empty() ? 1 : std::max(1, std::atoi(per.c_str()));
    }
    w.node_rank = to_int(env, "SLURM_NODEID", 0);
    w.nnodes = to_int(env, "SLURM_NNODES", 1);
    w.master_addr = str(env, "MASTER_ADDR", first_slurm_host(str(env, "SLURM_JOB_NODELIST", "127.0.0.1")));
    // Slurm gives no port; derive one from the job id so concurrent jobs on a node do not collide.
    w.master_port = to_int(env, "MASTER_PORT", 20000 + to_int(env, "SLURM_JOB_ID", 9500) % 20000);
    // A requeued job (scontrol requeue, or a preemption with requeue) keeps its id and counts its restarts.
    w.restart_count = to_int(env, "SLURM_RESTART_COUNT", 0);
    w.run_id = str(env, "SLURM_JOB_ID", "");
    check(w, "Slurm environment");
    return w;
  }
  if (lookup(env, "OMPI_COMM_WORLD_RANK") && lookup(env, "OMPI_COMM_WORLD_SIZE")) {
    w.launcher = "mpi";
    w.rank = to_int(env, "OMPI_COMM_WORLD_RANK", 0);
    w.world_size = to_int(env, "OMPI_COMM_WORLD_SIZE", 1);
    w.local_rank = to_int(env, "OMPI_COMM_WORLD_LOCAL_RANK", 0);
    w.local_world_size = to_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", 1);
    w.node_rank = to_int(env, "OMPI_COMM_WORLD_NODE_RANK", 0);
    w.nnodes = (w.world_size + w.local_world_size - 1) / w.local_world_size;
    if (w.nnodes > 1 && !lookup(env, "MASTER_ADDR"))
      throw LaunchError("Open MPI job across machines without MASTER_ADDR",
                        "run mpirun with -x MASTER_ADDR=<host of rank 0> -x MASTER_PORT=<free port>");
    w.master_addr = str(env, "MASTER_ADDR", "127.0.0.1");
    w.master_port = to_int(env, "MASTER_PORT", 29500);
    check(w, "Open MPI environment");
    return w;
  }
  return w;
}

}  // namespace cohort::comm

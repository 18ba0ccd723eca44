#include "cohort/comm/Rendezvous.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "cohort/comm/GlooCommunicator.h"
#include "cohort/store/AuthStore.h"
#include "cohort/store/TcpStoreClient.h"
#include "cohort/util/AtomicFile.h"
#if COHORT_HAVE_NCCL
#include <torch/cuda.h>

#include "cohort/comm/NcclCommunicator.h"
#endif
#include "cohort/util/Error.h"
#include "cohort/util/FileLimit.h"

namespace cohort::comm {
namespace {

std::string interface_address(const std::string& ifname) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return {};
  std::string found;
  for (ifaddrs* a = list; a; a = a->ifa_next) {
    if (a->ifa_addr && a->ifa_addr->sa_family == AF_INET && ifname == a->ifa_name) {
      char buf[INET_ADDRSTRLEN];
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, buf, sizeof buf);
      found = buf;
      break;
    }
  }
  freeifaddrs(list);
  return found;
}

CommunicatorPtr nccl_communicator(const World& world, std::chrono::milliseconds timeout) {
  const WorldInfo& info = world.info;
  const std::string who = "rank " + std::to_string(info.rank);
#if COHORT_HAVE_NCCL
  const int devices = torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
  if (info.local_rank >= devices) {
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    throw CommError(who + ": dist.backend=nccl needs one GPU per process, but local rank " +
                        std::to_string(info.local_rank) + " sees " + std::to_string(devices) + " CUDA device(s)" +
                        (visible ? " (CUDA_VISIBLE_DEVICES=" + std::string(visible) + ")" : ""),
                    "start at most as many processes per machine as it has GPUs (--nproc-per-node), check "
                    "nvidia-smi and CUDA_VISIBLE_DEVICES, or use dist.backend=gloo");
  }
  return NcclCommunicator::create(communicator_store("nccl", world.store), info.rank, info.world_size, info.local_rank,
                                  timeout);
#else
  throw CommError(who +
                      ": dist.backend=nccl is not available: this cohort was built without CUDA (COHORT_CUDA=OFF: "
                      "the LibTorch it was built against has no CUDA)",
                  "build against a CUDA LibTorch (scripts/gpu-check shows how) or use dist.backend=gloo");
#endif
}

}  // namespace

bool is_loopback(const std::string& host) { return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1"; }

std::string rendezvous_secret(const WorldInfo& info) {
  std::string secret = store::secret_from_env();
  if (secret.empty() && !is_loopback(info.master_addr))
    throw CommError("the rendezvous store would listen on " + info.master_addr +
                        ", reachable from other machines, without a shared secret",
                    "set COHORT_TOKEN to the same random string on every machine (`openssl rand -hex 32`), or pass "
                    "--token-file FILE (mode 600) to cohort train on every machine");
  return secret;
}

std::string local_address_for(const std::string& master_addr) {
  for (const char* var : {"COHORT_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"}) {
    if (const char* ifname = std::getenv(var); ifname && *ifname) {
      const std::string addr = interface_address(ifname);
      if (addr.empty())
        throw CommError(std::string(var) + "=" + ifname + " names no interface with an IPv4 address",
                        "list interfaces with `ip -4 addr` and pick one that reaches the other machines");
      return addr;
    }
  }
  if (is_loopback(master_addr)) return "127.0.0.1";
  // Ask the kernel which local address routes to the master: connect() on a UDP socket sends nothing.
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(master_addr.c_str(), "9", &hints, &res) != 0 || !res)
    throw CommError("cannot resolve master address '" + master_addr + "'",
                    "pass --master-addr as an IP address or a resolvable host name");
  std::string local;
  const int fd = socket(AF_INET, SOCK_DGRAM, 0);
  if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
    sockaddr_in sa{};
    socklen_t len = sizeof sa;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) == 0) {
      char buf[INET_ADDRSTRLEN];
      inet_ntop(AF_INET, &sa.sin_addr, buf, sizeof buf);
      local = buf;
    }
  }
  if (fd >= 0) close(fd);
  freeaddrinfo(res);
  if (local.empty())
    throw CommError("no route from this machine to master address '" + master_addr + "'",
                    "check the network, or set COHORT_SOCKET_IFNAME to the interface to use");
  return local;
}

c10::intrusive_ptr<c10d::Store> connect_to_store(const WorldInfo& info, std::chrono::milliseconds timeout) {
  const auto port = static_cast<uint16_t>(info.master_port);
  if (!info.agent_store)
    return c10::make_intrusive<store::AuthStore>(info.master_addr, port, rendezvous_secret(info), timeout);
  // torchrun's agent hosts a c10d TCPStore: we are one of its clients, with its (lack of) checks, in
  // whichever protocol its PyTorch speaks. See Note [c10d's two store protocols].
  c10::intrusive_ptr<c10d::Store> agent =
      c10::make_intrusive<store::TcpStoreClient>(info.master_addr, port, timeout, "torchrun's agent store");
  return c10::make_intrusive<c10d::PrefixStore>("/worker/attempt_" + std::to_string(info.restart_count), agent);
}

// The job's store address beside its flight records: `cohort doctor --ask RUN_DIR` reads it to ask every
// rank for a record through the store (comm/PeerWatch.h). Not secret: the token stays in the environment.
void write_store_address(const std::filesystem::path& run_dir, const WorldInfo& info, const std::string& backend) {
  const nlohmann::json j = {{"format", kStoreAddressFormat},
                            {"version", 1},
                            {"master_addr", info.master_addr},
                            {"master_port", info.master_port},
                            {"agent_store", info.agent_store},
                            {"restart_count", info.restart_count},
                            {"world_size", info.world_size},
                            {"launcher", info.launcher},
                            {"backend", backend}};
  std::filesystem::create_directories(run_dir / "flight");
  util::write_file_atomic(run_dir / "flight" / "store.json", j.dump(1) + "\n");
  // On one machine the launcher made the secret up and nobody else knows it: it is kept beside the
  // address, readable by this user alone (mode 600, as --token-file must be), for --ask to prove itself
  // with. Across machines the user holds the secret already, and it is not copied to a disk that may be
  // shared.
  const std::string secret = store::secret_from_env();
  if (info.agent_store || !is_loopback(info.master_addr) || secret.empty()) return;
  util::write_private_file_atomic(store_token_path(run_dir), secret);
}

c10::intrusive_ptr<c10d::Store> communicator_store(const std::string& backend,
                                                   c10::intrusive_ptr<c10d::Store> job_store) {
  return c10::make_intrusive<c10d::PrefixStore>(backend == "nccl" ? "cohort/nccl" : "cohort/gloo",
                                                std::move(job_store));
}

std::filesystem::path store_token_path(const std::filesystem::path& run_dir) {
  return run_dir / "flight" / "store.token";
}

StoreAddress read_store_address(const std::filesystem::path& run_dir) {
  const auto path = run_dir / "flight" / "store.json";
  std::ifstream in(path);
  if (!in)
    throw Error("no " + path.string() + ": this run dir has no running job's store address",
                "each machine's first rank writes it when the job starts (a run of this version, more than one "
                "rank); give the run dir of a job that is running now");
  try {
    const auto j = nlohmann::json::parse(in);
    if (j.at("format") != kStoreAddressFormat || j.at("version").get<int>() != 1) throw std::runtime_error("format");
    WorldInfo info;
    info.master_addr = j.at("master_addr").get<std::string>();
    info.master_port = j.at("master_port").get<int>();
    info.agent_store = j.at("agent_store").get<bool>();
    info.restart_count = j.at("restart_count").get<int>();
    info.world_size = j.at("world_size").get<int>();
    info.launcher = j.at("launcher").get<std::string>();
    info.rank = -1;  // a client that is none of the ranks
    return {info, j.at("backend").get<std::string>()};
  } catch (const std::exception& e) {
    throw Error(path.string() + " is not a store address of this version (" + e.what() + ")",
                "it is written by cohort's workers; do not edit it");
  }
}

World rendezvous(const WorldInfo& info, const std::string& backend, std::chrono::milliseconds timeout,
                 int gloo_threads) {
  World world;
  world.info = info;
  const std::string who = "rank " + std::to_string(info.rank);
  if (info.world_size == 1) {
    world.store = c10::make_intrusive<c10d::HashStore>();
  } else {
    const bool host = info.rank == 0 && !info.agent_store;
    // Before any connection, so that a job too large for ulimit -n stops here and says so, rather than in
    // Gloo's connect ("Too many open files") or with a store refusing ranks.
    if (auto why = util::open_file_shortfall(info.rank, info.world_size, host, util::raise_open_file_limit()))
      throw CommError(who + ": " + *why,
                      "raise the hard limit of open files for the workers: ulimit -Hn in the shell that starts them "
                      "(as root), LimitNOFILE= in a systemd unit, nofile in /etc/security/limits.conf, or "
                      "--ulimit nofile=N:N for a container");
    try {
      if (host)
        world.store = store::AuthStore::host(info.master_addr, static_cast<uint16_t>(info.master_port),
                                             rendezvous_secret(info), timeout);
      else
        world.store = connect_to_store(info, timeout);
    } catch (const CommError& e) {
      throw CommError(who + ": " + e.what(), e.hint());
    } catch (const std::exception& e) {
      const std::string msg = e.what();
      throw CommError(who + ": cannot reach the rendezvous store at " + info.master_addr + ":" +
                          std::to_string(info.master_port) + " within " + std::to_string(timeout.count() / 1000) +
                          " s: " + msg.substr(0, msg.find('\n')),
                      "check that torchrun's agent is running and MASTER_ADDR/MASTER_PORT are right");
    }
  }
  world.store->setTimeout(timeout);
  // Two processes given the same rank would otherwise wait in Gloo's connect until the timeout and fail
  // with a message about peers. Each rank claims its number in the store first: the second claimant
  // stops at once, and leaves a note the others' connect error quotes when their wait runs out.
  if (info.world_size > 1) {
    const auto claim = "cohort/rank_claims/" + std::to_string(info.rank);
    if (world.store->add(claim, 1) > 1) {
      const std::string msg = "two processes were given rank " + std::to_string(info.rank) + " of " +
                              std::to_string(info.world_size) + " (the second was node " +
                              std::to_string(info.node_rank) + ", local rank " + std::to_string(info.local_rank) + ")";
      world.store->set("cohort/duplicate_rank", std::vector<uint8_t>(msg.begin(), msg.end()));
      throw CommError(who + ": " + msg,
                      "give every machine its own --node-rank (0 .. nnodes-1), or every process "
                      "its own RANK / SLURM_PROCID");
    }
  }
  if (backend != "gloo" && backend != "nccl")
    throw CommError(who + ": unknown backend '" + backend + "'", "use dist.backend=gloo, or nccl on GPUs");
  try {
    if (backend == "gloo")
      world.comm = GlooCommunicator::create(communicator_store("gloo", world.store), info.rank, info.world_size,
                                            local_address_for(info.master_addr), timeout, gloo_threads);
    else
      world.comm = nccl_communicator(world, timeout);
  } catch (const CommError& e) {
    if (info.world_size > 1 && world.store->check({"cohort/duplicate_rank"})) {
      const auto v = world.store->get("cohort/duplicate_rank");
      throw CommError(std::string(e.what()) + "; the store says: " + std::string(v.begin(), v.end()),
                      "give every machine its own --node-rank, or every process its own RANK");
    }
    throw;
  }
  return world;
}

}  // namespace cohort::comm

// Rendezvous: turns a WorldInfo into a connected World (store + communicator).
//
//   namespace comm = cohort::comm;
//   comm::World world = comm::rendezvous(comm::world_from_env(comm::current_env()), "gloo", std::chrono::seconds(300));
//   world.comm->barrier("start")->wait();
//
// Rank 0 hosts cohort's authenticated store (store::StoreServer) on master_addr:master_port, and only
// there; the others connect to it and prove they hold the job's secret. Under torchrun with an agent
// store, the agent's TCPStore is used instead, in its own protocol (store::TcpStoreClient). A single
// process needs no network: it gets an in-process store.
#pragma once

#include <chrono>
#include <filesystem>
#include <string>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "cohort/comm/Communicator.h"
#include "cohort/comm/WorldInfo.h"
#include "cohort/util/OldNames.h"  // the names of the last release, for programs outside this tree

namespace cohort::comm {

struct World {
  WorldInfo info;
  c10::intrusive_ptr<c10d::Store> store;
  CommunicatorPtr comm;
};

// `gloo_threads`: how many collectives the Gloo backend runs at once (GlooCommunicator::create).
World rendezvous(const WorldInfo& info, const std::string& backend, std::chrono::milliseconds timeout,
                 int gloo_threads = 2);

// A client of the job's store, connected as a rank that does not host it: cohort's authenticated store
// (the secret from rendezvous_secret), or torchrun's agent store under this attempt's prefix.
c10::intrusive_ptr<c10d::Store> connect_to_store(const WorldInfo& info, std::chrono::milliseconds timeout);

// RUN_DIR/flight/store.json: where a running job's store is (address, port, torchrun's agent store or
// not, the attempt, the world size), which each machine's first rank writes at start so that
// `cohort doctor --ask RUN_DIR` can reach it. A job on one machine, whose secret the launcher made up,
// also leaves that secret in store_token_path(RUN_DIR), mode 600; across machines it stays with the user.
inline constexpr const char* kStoreAddressFormat = "cohort-store-address";
void write_store_address(const std::filesystem::path& run_dir, const WorldInfo& info, const std::string& backend);
std::filesystem::path store_token_path(const std::filesystem::path& run_dir);
// The address as a WorldInfo of no rank (rank -1), and the job's backend; throws cohort::Error naming a
// missing or foreign file.
struct StoreAddress {
  WorldInfo info;
  std::string backend;
};
StoreAddress read_store_address(const std::filesystem::path& run_dir);

// The store a job's communicator, and its PeerWatch, use: the job's store under the backend's prefix.
c10::intrusive_ptr<c10d::Store> communicator_store(const std::string& backend,
                                                   c10::intrusive_ptr<c10d::Store> job_store);

// Whether `host` names this machine's loopback interface.
bool is_loopback(const std::string& host);

// The job's secret for the rendezvous store (COHORT_TOKEN or COHORT_TOKEN_FILE). Empty is allowed only
// when the store listens on loopback; otherwise throws CommError saying how to set one.
std::string rendezvous_secret(const WorldInfo& info);

// The local address Gloo should bind to so that it reaches `master_addr`: loopback for a local master,
// otherwise the address of the interface the kernel routes to it, or the interface named by
// COHORT_SOCKET_IFNAME / GLOO_SOCKET_IFNAME.
std::string local_address_for(const std::string& master_addr);

}  // namespace cohort::comm

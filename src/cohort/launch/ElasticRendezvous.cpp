#include "cohort/launch/ElasticRendezvous.h"

#include <algorithm>
#include <thread>

#include "cohort/util/Error.h"

namespace cohort::launch {

ElasticRendezvous::ElasticRendezvous(const LaunchOptions& o, const std::string& secret)
    : o_(o), timeout_(static_cast<int64_t>(o.rdzv_timeout_s * 1000)) {
  const auto port = static_cast<uint16_t>(o.master_port);
  if (o.node_rank == 0)
    store_ = store::AuthStore::host(o.master_addr, port, secret, timeout_);
  else
    store_ = c10::make_intrusive<store::AuthStore>(o.master_addr, port, secret, timeout_);
}

ElasticRendezvous::Members ElasticRendezvous::join(int round) {
  const std::string k = key(round);
  const int64_t arrival = store_->add(k + "joined", 1);
  store_->set(k + "node/" + std::to_string(arrival), bytes(std::to_string(o_.node_rank)));
  if (o_.node_rank == 0) {
    const auto start = std::chrono::steady_clock::now();
    while (store_->add(k + "joined", 0) < o_.min_nodes) {
      if (std::chrono::steady_clock::now() - start > timeout_)
        throw LaunchError("only " + std::to_string(store_->add(k + "joined", 0)) + " of the " +
                              std::to_string(o_.min_nodes) + " machines --nnodes " + std::to_string(o_.min_nodes) +
                              ":" + std::to_string(o_.nnodes) + " asks for joined (round " + std::to_string(round) +
                              ") within " + std::to_string(timeout_.count() / 1000) + " s",
                          "start `cohort train` on more machines, or lower MIN in --nnodes MIN:MAX");
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    // A last call, so that machines starting a moment apart all make the first round; after a failure,
    // long enough for every survivor to stop its workers (up to the grace period) and come back.
    const auto last_call = std::chrono::steady_clock::now() + kLastCall +
                           (round > 0 ? std::chrono::milliseconds(static_cast<int64_t>(o_.grace_s * 1000) + 2000)
                                      : std::chrono::milliseconds(0));
    while (store_->add(k + "joined", 0) < o_.nnodes && std::chrono::steady_clock::now() < last_call)
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    store_->set(k + "closed", bytes(std::to_string(store_->add(k + "joined", 0))));
  }
  store_->wait({k + "closed"}, timeout_);
  const int n = std::stoi(text(store_->get(k + "closed")));
  if (arrival > n)
    throw LaunchError("machine --node-rank " + std::to_string(o_.node_rank) + " arrived after round " +
                          std::to_string(round) + " of the launchers' rendezvous closed with " + std::to_string(n) +
                          " machine(s)",
                      "start every machine's `cohort train` within a few seconds of node 0's");
  Members m;
  for (int i = 1; i <= n; ++i) m.original.push_back(std::stoi(text(store_->get(k + "node/" + std::to_string(i)))));
  std::sort(m.original.begin(), m.original.end());
  m.nnodes = n;
  m.node_rank = static_cast<int>(std::find(m.original.begin(), m.original.end(), o_.node_rank) - m.original.begin());
  return m;
}

void ElasticRendezvous::mark_failed(int round, const std::string& why) {
  try {
    store_->set(key(round) + "failed", bytes(why));
  } catch (const std::exception&) {
    // Node 0's store is gone: the other launchers learn of the failure from their own workers.
  }
}

std::string ElasticRendezvous::failed_elsewhere(int round) {
  try {
    if (!store_->check({key(round) + "failed"})) return {};
    return text(store_->get(key(round) + "failed"));
  } catch (const std::exception&) {
    // Node 0's launcher is gone. If its machine died, our workers' collectives fail and say so; if it
    // simply finished, ours are finishing too. Either way the workers decide, not this poll.
    return {};
  }
}

void ElasticRendezvous::finish(int round, int members) {
  try {
    store_->add(key(round) + "done", 1);
    if (o_.node_rank != 0) return;
    const auto start = std::chrono::steady_clock::now();
    while (store_->add(key(round) + "done", 0) < members && !store_->check({key(round) + "failed"}) &&
           std::chrono::steady_clock::now() - start < timeout_)
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
  } catch (const std::exception&) {
  }
}

}  // namespace cohort::launch

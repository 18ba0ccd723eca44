// The launchers' own rendezvous for an elastic job (--nnodes MIN:MAX, or several machines with
// --max-restarts): before each attempt the launchers meet in a store of their own on node 0, agree on
// the machines of this round and on their ranks, and tell each other when one's workers failed.
//
//   ElasticRendezvous rdzv(options, secret);
//   const auto m = rdzv.join(attempt);            // m.nnodes machines, this one is m.node_rank
//   ... start and watch the workers ...
//   if (failed) rdzv.mark_failed(attempt, "worker rank 3 exited with code 1");
//   else rdzv.finish(attempt, m.nnodes);
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "cohort/launch/Launcher.h"
#include "cohort/store/AuthStore.h"

namespace cohort::launch {

// Note [Elastic rendezvous of launchers]
// With --nnodes MIN:MAX the launchers meet before each attempt in a store of their own, hosted by node 0's
// launcher on --master-port (the workers' store moves to --master-port + 1). Round r:
//   every launcher: add("rdzv/r/joined") -> its arrival number i; set("rdzv/r/node/i", its --node-rank)
//   node 0: waits for MIN arrivals (up to dist.timeout_s), then a short last call for the rest, up to MAX;
//           set("rdzv/r/closed", n)
//   every launcher: the first n arrivals are the members; node ranks are renumbered in --node-rank order
// A launcher whose workers fail sets "rdzv/r/failed"; the others see it, stop theirs, and all meet in round
// r+1, without the machine that vanished. Node 0 hosts both stores, so losing node 0 ends the job (as
// losing the c10d rendezvous host ends a torchrun job); any other machine may go.
class ElasticRendezvous {
 public:
  ElasticRendezvous(const LaunchOptions& o, const std::string& secret);

  struct Members {
    int nnodes = 0;
    int node_rank = 0;
    std::vector<int> original;  // the members' --node-rank values, in order
  };

  // Round `round`'s members; node 0 closes it once MIN machines came and a short last call passed.
  // Throws LaunchError when too few come within dist.timeout_s, or this one came after it closed.
  Members join(int round);
  // This machine's workers failed in `round`: the other launchers stop theirs and meet again.
  void mark_failed(int round, const std::string& why);
  // Why another machine failed in `round` ("" when none did, or when node 0's store is gone).
  std::string failed_elsewhere(int round);
  // This machine's workers all succeeded. Node 0 keeps the launchers' store up until every member is
  // done (or one failed), so that no one mistakes its exit for a failure.
  void finish(int round, int members);

 private:
  static constexpr auto kLastCall = std::chrono::seconds(3);
  static std::string key(int round) { return "rdzv/" + std::to_string(round) + "/"; }
  static std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
  static std::string text(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

  const LaunchOptions& o_;
  std::chrono::milliseconds timeout_;
  c10::intrusive_ptr<store::AuthStore> store_;
};

}  // namespace cohort::launch

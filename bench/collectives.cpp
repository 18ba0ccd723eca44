// Time of cohort's collectives (all_reduce, reduce_scatter, all_gather) by message size, on the engine
// the strategies use: what bench/cost_model.py fits its latency-bandwidth model to. One process per rank,
// started the way a launcher starts workers (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; COHORT_TOKEN
// when the master is not on loopback). Rank 0 prints one JSON object.
//
//   RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29600 build/bench/collectives --max-bytes 4194304 &
//   RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29600 build/bench/collectives --max-bytes 4194304
//
// A size is the whole buffer, as nccl-tests counts it: the tensor all_reduce reduces, reduce_scatter's
// input and all_gather's output. Each rank moves (W-1)/W of it per phase on a ring.
#include <algorithm>
#include <chrono>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include <torch/torch.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cohort/comm/Rendezvous.h"

namespace {

using Clock = std::chrono::steady_clock;

// How long each rank leaves its links idle before a repetition's barrier (--idle-ms): with a shaped link,
// long enough for its token bucket to fill again, so that every repetition starts as the cost model
// assumes (bench/cost_model.py). Back to back, a repetition found the bucket as the last one left it.
std::chrono::microseconds idle{0};

// Seconds of one collective of `bytes` (float32), as every rank sees it: a barrier lines the ranks up
// first, so rank 0's clock measures the collective and not the wait for a late rank.
double time_once(cohort::comm::Communicator& comm, const std::string& op, int64_t bytes) {
  const int64_t w = comm.size();
  const int64_t n = std::max<int64_t>(w, bytes / 4 / w * w);  // whole chunks per rank
  at::Tensor full = at::ones({n});
  at::Tensor part = at::ones({n / w});
  std::this_thread::sleep_for(idle);
  comm.barrier("collectives: line up")->wait();
  const auto t0 = Clock::now();
  if (op == "all_reduce")
    comm.all_reduce(full, cohort::comm::ReduceOp::kSum, "collectives")->wait();
  else if (op == "reduce_scatter")
    comm.reduce_scatter(part, full, cohort::comm::ReduceOp::kSum, "collectives")->wait();
  else
    comm.all_gather(full, part, "collectives")->wait();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

nlohmann::json measure(cohort::comm::Communicator& comm, const std::string& op, int64_t bytes, int reps) {
  time_once(comm, op, bytes);  // warm-up: connections, allocations
  std::vector<double> s;
  for (int i = 0; i < reps; ++i) s.push_back(time_once(comm, op, bytes));
  std::sort(s.begin(), s.end());
  return {{"op", op}, {"bytes", bytes}, {"reps", reps}, {"median_s", s[s.size() / 2]}, {"min_s", s.front()}};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"cohort's collectives by message size (bench/cost_model.py runs it)"};
  int64_t min_bytes = 4096, max_bytes = 64 << 20;
  double seconds_per_size = 3.0, idle_ms = 0.0;
  std::string ops = "all_reduce,reduce_scatter,all_gather";
  app.add_option("--min-bytes", min_bytes, "smallest buffer (bytes)");
  app.add_option("--max-bytes", max_bytes, "largest buffer (bytes); sizes step by 4x");
  app.add_option("--seconds-per-size", seconds_per_size, "time spent at each size (at least 3 repetitions)");
  app.add_option("--ops", ops, "comma-separated: all_reduce, reduce_scatter, all_gather");
  app.add_option("--idle-ms", idle_ms, "idle time before each repetition's barrier (a shaped link's bucket refills)");
  CLI11_PARSE(app, argc, argv);
  idle = std::chrono::microseconds(static_cast<int64_t>(idle_ms * 1000));
  at::set_num_threads(1);

  cohort::comm::World world = cohort::comm::rendezvous(cohort::comm::world_from_env(cohort::comm::current_env()),
                                                       "gloo", std::chrono::seconds(600), /*gloo_threads=*/1);
  auto& comm = *world.comm;
  nlohmann::json results = nlohmann::json::array();
  std::stringstream list(ops);
  for (std::string op; std::getline(list, op, ',');) {
    for (int64_t bytes = min_bytes; bytes <= max_bytes; bytes *= 4) {
      // Repetitions from one timed call, the same on every rank (rank 0's figure is broadcast).
      at::Tensor probe = at::full({1}, time_once(comm, op, bytes), at::kDouble);
      comm.broadcast(probe, 0, "collectives: probe")->wait();
      const int reps = std::clamp(static_cast<int>(seconds_per_size / probe.item<double>()), 3, 50);
      results.push_back(measure(comm, op, bytes, reps));
    }
  }
  if (comm.rank() == 0)
    std::cout << nlohmann::json{{"bench", "collectives"},
                                {"world", comm.size()},
                                {"backend", comm.backend_name()},
                                {"results", results}}
                     .dump()
              << std::endl;
  return 0;
}

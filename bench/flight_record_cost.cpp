// What one flight record costs (comm/FlightRecorder.h): issued() and ended() for one collective, on a
// ring of dist.flight_records' default size, after the ring has gone round once (so that no record
// allocates). bench/flight_overhead.py multiplies it by the collectives of a step.
//
//   build/bench/flight_record_cost     # prints {"ns_per_record": ...}
#include <algorithm>
#include <chrono>
#include <iostream>
#include <vector>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "cohort/comm/FlightRecorder.h"

int main() {
  cohort::comm::FlightRecorder rec(2000);
  const at::Tensor t = at::zeros({1024});
  const std::string what = "gradient bucket 3";
  uint64_t seq = 0;
  const auto lap = [&](int n) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) {
      rec.issued(++seq, "all_reduce", what, t);
      rec.ended(seq, true);
    }
    return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / n;
  };
  lap(4000);  // twice round the ring
  std::vector<double> ns;
  for (int r = 0; r < 7; ++r) ns.push_back(lap(200000));
  std::sort(ns.begin(), ns.end());
  std::cout << nlohmann::json{{"bench", "flight_record_cost"},
                              {"ring", 2000},
                              {"ns_per_record", ns[ns.size() / 2]},
                              {"ns_per_record_min", ns.front()},
                              {"ns_per_record_max", ns.back()}}
                   .dump()
            << std::endl;
}

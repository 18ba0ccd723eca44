// Round-trip latency of the rendezvous store: cohort's authenticated store (StoreServer + AuthStore)
// against c10d's TCPStore, the peer it replaces, in the same run on loopback. Workers touch the store once
// per collective (Note: the "issued" markers in GlooCommunicator), so its set() is on the training path.
//
//   build/bench/store_latency > bench/results/store_latency.json
#include <algorithm>
#include <chrono>
#include <functional>
#include <iostream>
#include <vector>

#include <nlohmann/json.hpp>

#include "cohort/store/AuthStore.h"
#include "cohort/util/TorchCompat.h"

namespace {

using Clock = std::chrono::steady_clock;

// Median and 99th percentile in microseconds of `n` calls of `op`, after a warm-up.
nlohmann::json time_op(int n, const std::function<void(int)>& op) {
  for (int i = 0; i < 200; ++i) op(i);
  std::vector<double> us(n);
  for (int i = 0; i < n; ++i) {
    const auto t0 = Clock::now();
    op(i);
    us[i] = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  }
  std::sort(us.begin(), us.end());
  return {{"median_us", us[n / 2]}, {"p99_us", us[n * 99 / 100]}};
}

nlohmann::json measure(c10d::Store& store, int n) {
  const std::vector<uint8_t> value(16, 7);
  store.set("warm", value);
  return {{"set", time_op(n, [&](int i) { store.set("k" + std::to_string(i % 64), value); })},
          {"get", time_op(n, [&](int) { store.get("warm"); })},
          {"add", time_op(n, [&](int) { store.add("counter", 1); })}};
}

}  // namespace

int main() {
  constexpr int kOps = 20000;
  const auto timeout = std::chrono::seconds(30);
  nlohmann::json out;
  {
    auto host = cohort::store::AuthStore::host("127.0.0.1", 0, cohort::store::random_secret(), timeout);
    out["cohort_auth_store"] = measure(*host, kOps);
  }
  {
    auto server = c10::make_intrusive<c10d::TCPStore>(
        "127.0.0.1", cohort::compat::tcp_store_options(0, /*is_server=*/true, 1, timeout));
    out["c10d_tcpstore"] = measure(*server, kOps);
  }
  for (const char* op : {"set", "get", "add"})
    out["ratio_cohort_over_c10d_median"][op] =
        out["cohort_auth_store"][op]["median_us"].get<double>() / out["c10d_tcpstore"][op]["median_us"].get<double>();
  out["ops_each"] = kOps;
  out["what"] = "one client, loopback, 16-byte values; cohort's store authenticates once per connection";
  out["command"] = "build/bench/store_latency > bench/results/store_latency.json";
  std::cout << out.dump(1) << std::endl;
}

// Round-trip latency of the rendezvous store: cohort's authenticated store (StoreServer + AuthStore)
// against c10d's TCPStore, the peer it replaces, in the same run on loopback; then a rendezvous of 8 to
// 1,024 clients on each (one thread per client, as ranks of a job would connect). Workers touch the store once
// per collective (Note: the "issued" markers in GlooCommunicator), so its set() is on the training path.
//
//   build/bench/store_latency > bench/results/store_latency.json
#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <iostream>
#include <mutex>
#include <string>
#include <thread>
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

// A rendezvous's pattern with `clients` clients, one thread each as ranks would be: each connects, sets its
// address, adds itself to a counter, and waits for the key the last one to arrive sets. Returns the seconds
// from the first connect to the last client through, and how many clients failed (with the first error).
nlohmann::json rendezvous(const std::function<c10::intrusive_ptr<c10d::Store>()>& connect, int clients) {
  std::atomic<int> failed{0};
  std::mutex first_error_mutex;
  std::string first_error;
  const std::vector<uint8_t> address(24, 1);
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(clients));
  const auto t0 = Clock::now();
  for (int i = 0; i < clients; ++i)
    threads.emplace_back([&, i] {
      try {
        auto store = connect();
        store->set("address/" + std::to_string(i), address);
        if (store->add("arrived", 1) == clients) store->set("go", std::vector<uint8_t>{1});
        store->get("go");
      } catch (const std::exception& e) {
        ++failed;
        std::lock_guard lock(first_error_mutex);
        if (first_error.empty()) first_error = e.what();
      }
    });
  for (auto& t : threads) t.join();
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  nlohmann::json out{{"seconds", seconds}, {"failed", failed.load()}};
  if (!first_error.empty()) out["first_error"] = first_error.substr(0, 400);
  return out;
}

// The median of kRepeats rendezvous, each on a fresh server from `host` (which returns a connect function).
nlohmann::json median_rendezvous(const std::function<std::function<c10::intrusive_ptr<c10d::Store>()>()>& host,
                                 int clients) {
  constexpr int kRepeats = 3;
  std::vector<nlohmann::json> runs;
  for (int r = 0; r < kRepeats; ++r) runs.push_back(rendezvous(host(), clients));
  std::sort(runs.begin(), runs.end(), [](const nlohmann::json& a, const nlohmann::json& b) {
    return a["seconds"].get<double>() < b["seconds"].get<double>();
  });
  auto out = runs[kRepeats / 2];
  out["runs"] = kRepeats;
  return out;
}

// Rendezvous at 8 to 1,024 clients for both stores: how the cost grows with the job, and where either stops.
nlohmann::json rendezvous_at_scale(std::chrono::milliseconds timeout) {
  nlohmann::json out = nlohmann::json::array();
  for (int clients : {8, 64, 256, 1024}) {
    nlohmann::json row{{"clients", clients}};
    c10::intrusive_ptr<c10d::Store> server;  // the one a connect function of `host` talks to, kept alive by it
    row["cohort_auth_store"] = median_rendezvous(
        [&] {
          const auto secret = cohort::store::random_secret();
          auto hosted = cohort::store::AuthStore::host("127.0.0.1", 0, secret, timeout);
          const uint16_t port = hosted->port();
          server = hosted;
          return [=] { return c10::make_intrusive<cohort::store::AuthStore>("127.0.0.1", port, secret, timeout); };
        },
        clients);
    row["c10d_tcpstore"] = median_rendezvous(
        [&] {
          auto hosted = c10::make_intrusive<c10d::TCPStore>(
              "127.0.0.1", cohort::util::compat::tcp_store_options(0, /*is_server=*/true, 1, timeout));
          const uint16_t port = hosted->getPort();
          server = hosted;
          return [=]() -> c10::intrusive_ptr<c10d::Store> {
            return c10::make_intrusive<c10d::TCPStore>(
                "127.0.0.1", cohort::util::compat::tcp_store_options(port, /*is_server=*/false, 1, timeout));
          };
        },
        clients);
    row["ratio_cohort_over_c10d"] =
        row["cohort_auth_store"]["seconds"].get<double>() / row["c10d_tcpstore"]["seconds"].get<double>();
    std::cerr << row.dump() << std::endl;
    out.push_back(row);
  }
  return out;
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
        "127.0.0.1", cohort::util::compat::tcp_store_options(0, /*is_server=*/true, 1, timeout));
    out["c10d_tcpstore"] = measure(*server, kOps);
  }
  for (const char* op : {"set", "get", "add"})
    out["ratio_cohort_over_c10d_median"][op] =
        out["cohort_auth_store"][op]["median_us"].get<double>() / out["c10d_tcpstore"][op]["median_us"].get<double>();
  out["rendezvous"] = rendezvous_at_scale(timeout);
  out["ops_each"] = kOps;
  out["what"] =
      "latency: one client, loopback, 16-byte values; cohort's store authenticates once per connection. "
      "rendezvous: N clients, one thread each, connect, set, add and wait for the last one";
  out["command"] = "build/bench/store_latency > bench/results/store_latency.json";
  std::cout << out.dump(1) << std::endl;
}

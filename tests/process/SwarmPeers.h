// What the swarm's process tests share: each peer a `cohort train` on its own loopback address, and
// the comparisons of their trained weights.
#pragma once

#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "cohort/checkpoint/Safetensors.h"
#include "process/Harness.h"

namespace cohort::testing {

// Peers whose steps take at least 100 ms (comm/FaultInjection.h), as on a slower machine: a run of these
// tests' tiny model otherwise ends within seconds, before a newcomer or a restarted peer is up.
inline std::map<std::string, std::string> slow_steps(std::map<std::string, std::string> env = {}) {
  env["COHORT_FAULT_STEP_DELAY_MS"] = "100";
  return env;
}

// Each test's peers on 127.0.0.<first + i>, on a port of this process, so runs never collide: from 20000
// to 27992, below the fixed 29xxx ports of the launch tests, which may run beside a swarm test, and below
// the kernel's free ports (Note [Process tests two at a time] in tests/CMakeLists.txt).
inline std::string address(int host) {
  const int port = 20000 + (::getpid() % 1000) * 8;
  return "127.0.0." + std::to_string(host) + ":" + std::to_string(port);
}

inline std::vector<std::string> peer_args(const std::filesystem::path& dir, int host, int bootstrap_host,
                                          std::vector<std::string> extra) {
  std::vector<std::string> a = {"--nproc-per-node", "1", "dist.strategy=swarm", "swarm.insecure=true",
                                "swarm.listen=" + address(host)};
  if (bootstrap_host > 0) a.push_back("swarm.initial_peers=" + address(bootstrap_host));
  a.insert(a.end(), extra.begin(), extra.end());
  return quick_args(dir, a);
}

// `count` peers started together on 127.0.0.<first_host + i>, each but the first joining through the
// first, in fresh run directories `name` + i (appended to `dirs`): `extra(i)` is peer i's settings, `env(i)`
// its environment.
inline std::vector<std::unique_ptr<Proc>> start_peers(
    const std::string& name, int count, int first_host, const std::function<std::vector<std::string>(int)>& extra,
    std::vector<std::filesystem::path>& dirs,
    const std::function<std::map<std::string, std::string>(int)>& env = [](int) {
      return std::map<std::string, std::string>{};
    }) {
  std::vector<std::unique_ptr<Proc>> peers;
  for (int i = 0; i < count; ++i) {
    dirs.push_back(fresh_dir(name + std::to_string(i)));
    peers.push_back(std::make_unique<Proc>(
        cohort_argv(peer_args(dirs.back(), first_host + i, i ? first_host : 0, extra(i))), env(i)));
  }
  return peers;
}

// The trained parameters, without batch norm's running statistics: each peer keeps its own (in train
// mode they do not enter the loss; ddp's ranks take rank 0's instead).
inline checkpoint::NamedTensors final_weights(const std::filesystem::path& dir) {
  const auto out = dir / "final.safetensors";
  const auto r = run_cohort({"export", dir.string(), "--out", out.string()});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  checkpoint::NamedTensors params;
  for (auto& [name, t] : checkpoint::load_safetensors(out).tensors)
    if (name.find("running_") == std::string::npos && name.find("num_batches_tracked") == std::string::npos)
      params.emplace_back(name, t);
  return params;
}

inline double max_difference(const checkpoint::NamedTensors& a, const checkpoint::NamedTensors& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    worst = std::max(worst, (a[i].second.to(at::kDouble) - b[i].second.to(at::kDouble)).abs().max().item<double>());
  }
  return worst;
}

// Where cohort is built without the swarm (no OpenDHT: Debian 13) each test says so and skips.
#if COHORT_HAVE_SWARM
#define SKIP_WITHOUT_SWARM()
#else
#define SKIP_WITHOUT_SWARM() GTEST_SKIP() << "dist.strategy=swarm is not built here: OpenDHT was not found"
#endif

}  // namespace cohort::testing

// A long run with every rank's memory and open file descriptors sampled from /proc while it trains:
// 4 workers, many small steps (heartbeats, store writes, collectives, log lines, a checkpoint). After
// warm-up (step 500) neither may grow beyond a stated bound. The curve goes to soak.json in the run dir.
#include <gtest/gtest.h>

#include <dirent.h>

#include <chrono>
#include <fstream>
#include <map>
#include <thread>

#include "process/Harness.h"

namespace fs = std::filesystem;
using namespace cohort::testing;

namespace {

int64_t rss_kib(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  return -1;
}

int open_fds(pid_t pid) {
  int n = 0;
  if (DIR* d = opendir(("/proc/" + std::to_string(pid) + "/fd").c_str())) {
    while (dirent* e = readdir(d))
      if (e->d_name[0] != '.') ++n;
    closedir(d);
  }
  return n;
}

void soak(int steps, int warmup_step, const std::string& name) {
  // Bounds: glibc keeps freed blocks (train.retain_memory) and arenas settle after warm-up, so some
  // movement is allocator noise; a leak per step or per collective would add far more over 2500 steps
  // (1 KiB per step is 2.4 MiB, per collective several times that). Sampled while training only (see
  // below), every worker grew 24 to 48 KiB on both builds (Debian's 1.13 and pip's 2.14); 8 MiB leaves
  // room for a machine whose allocator settles later. Descriptors: a save or a log flush holds a file
  // open for a moment (kFdTransient), but at rest, the fewest open over the last samples, the count must
  // be where it started.
  constexpr int64_t kRssGrowthKiB = 8 * 1024;
  constexpr int kFdGrowth = 0;
  constexpr int kFdTransient = 4;
  const auto dir = fresh_dir(name);
  // Enough epochs for `steps`: Fashion-MNIST's 60000 images in batches of 8 on 4 workers, 1875 steps each.
  Proc launcher(cohort_argv(quick_args(
      dir, {"--nproc-per-node", "4", "model.name=mlp", "model.width=16", "data.batch_size=8", "data.train_limit=0",
            "train.epochs=" + std::to_string(steps / 1875 + 1), "train.max_steps=" + std::to_string(steps),
            "eval.enabled=false", "log.every_steps=100", "log.progress=plain", "train.threads=1"})));
  std::map<pid_t, std::vector<std::pair<int64_t, int>>> samples;  // after warm-up: (rss KiB, fds)
  std::vector<std::pair<double, int64_t>> total_rss;              // (seconds, all workers' RSS)
  const auto start = std::chrono::steady_clock::now();
  bool warm = false;
  // About 8 ms a step here: a bound of 80 ms a step still ends a run that hangs.
  const auto limit = std::chrono::seconds(std::max(240, steps / 12));
  while (std::chrono::steady_clock::now() - start < limit) {
    if (!warm) warm = launcher.output_so_far().find(" step " + std::to_string(warmup_step) + "/") != std::string::npos;
    const auto workers = children_of(launcher.pid());
    std::map<pid_t, std::pair<int64_t, int>> now;
    if (warm && workers.size() == 4)
      for (pid_t w : workers) now[w] = {rss_kib(w), open_fds(w)};
    // Only samples taken while the workers still train count. Once the last step's line is out, the
    // workers save, write their summaries and tear down (with pip's LibTorch 2.14, RSS rose 16 to 36
    // MiB in the last 0.2 s before exit, after "cohort: done:"); that is the end of the run, not a
    // leak, and a slow machine that samples it more often must not fail the bound on it. The output is
    // read after sampling, so a sample that may have seen the end is dropped.
    const std::string out = launcher.output_so_far();
    if (out.find(" step " + std::to_string(steps) + "/") != std::string::npos ||
        out.find("cohort: done:") != std::string::npos)
      break;
    if (!now.empty()) {
      int64_t sum = 0;
      for (const auto& [w, sample] : now) {
        if (sample.first > 0 && sample.second > 0) samples[w].push_back(sample);
        sum += std::max<int64_t>(sample.first, 0);
      }
      total_rss.emplace_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), sum);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  const auto r = launcher.wait(60);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_EQ(samples.size(), 4u) << r.output;
  nlohmann::json per_worker = nlohmann::json::array();
  for (const auto& [pid, s] : samples) {
    ASSERT_GE(s.size(), 5u) << "too few samples after warm-up for worker " << pid;
    int64_t rss_max = 0;
    int fd_max = 0;
    for (const auto& [rss, fds] : s) {
      rss_max = std::max(rss_max, rss);
      fd_max = std::max(fd_max, fds);
    }
    EXPECT_LE(rss_max - s.front().first, kRssGrowthKiB)
        << "worker " << pid << " RSS grew from " << s.front().first << " KiB to " << rss_max << " KiB";
    int fd_rest = fd_max;
    for (size_t i = s.size() - std::min<size_t>(s.size(), 8); i < s.size(); ++i)
      fd_rest = std::min(fd_rest, s[i].second);
    EXPECT_LE(fd_rest - s.front().second, kFdGrowth)
        << "worker " << pid << " open descriptors went from " << s.front().second << " to " << fd_rest << " at rest";
    EXPECT_LE(fd_max - s.front().second, kFdTransient) << "worker " << pid << " held " << fd_max << " descriptors";
    per_worker.push_back({{"samples", s.size()},
                          {"rss_kib_first", s.front().first},
                          {"rss_kib_max", rss_max},
                          {"rss_kib_last", s.back().first},
                          {"fds_first", s.front().second},
                          {"fds_max", fd_max},
                          {"fds_at_rest_last", fd_rest}});
  }
  nlohmann::json curve = nlohmann::json::array();
  for (const auto& [t, rss] : total_rss) curve.push_back({{"seconds", t}, {"rss_kib_all_workers", rss}});
  std::ofstream(dir / "soak.json") << nlohmann::json{{"steps", steps},
                                                     {"workers", 4},
                                                     {"warmup_step", warmup_step},
                                                     {"bound_rss_growth_kib", kRssGrowthKiB},
                                                     {"bound_fd_growth", kFdGrowth},
                                                     {"bound_fd_transient", kFdTransient},
                                                     {"per_worker", per_worker},
                                                     {"curve", curve}}
                                          .dump(1)
                                   << "\n";
}

}  // namespace

// One length only, in make test: a 1000-step run (warm from step 300) and a 1500-step run (warm from step
// 500) each failed once on pip's LibTorch 2.14, one worker's RSS rising 94 and 47 MiB after warm-up, where
// 3000 steps (warm from 500) stays within the bound on every LibTorch. 3000 steps take about 23 s.
TEST(Soak, FourWorkersThreeThousandStepsHoldMemoryAndDescriptorsSteady) { soak(3000, 500, "soak"); }

// The long variant (label slow: `make test-slow`): four times the steps with the same bounds, so a leak
// too small to pass a bound in 2500 warm steps (under about 3 KiB a step) still shows in 11500.
TEST(SlowSoak, FourWorkersTwelveThousandStepsHoldMemoryAndDescriptorsSteady) { soak(12000, 500, "soak-long"); }

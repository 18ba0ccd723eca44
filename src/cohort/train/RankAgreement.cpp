#include "cohort/train/RankAgreement.h"

#include <ctime>
#include <iomanip>
#include <sstream>

#include "cohort/checkpoint/Names.h"
#include "cohort/util/Error.h"

namespace cohort::train {
namespace fs = std::filesystem;
namespace {

std::vector<uint8_t> store_bytes(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }

std::string timestamp() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  std::ostringstream os;
  os << std::put_time(&tm, "%Y%m%d-%H%M%S");
  return os.str();
}

}  // namespace

std::string decided_by_rank0(comm::World& world, const std::string& key, const std::function<std::string()>& decide) {
  if (world.info.world_size == 1) return decide();
  if (world.info.rank == 0) {
    std::string value;
    try {
      value = decide();
    } catch (const std::exception& e) {
      world.store->set(key, store_bytes("!" + std::string(e.what())));
      throw;
    }
    world.store->set(key, store_bytes("=" + value));
    return value;
  }
  const auto v = world.store->get(key);
  const std::string text(v.begin(), v.end());
  if (text.empty() || text[0] != '=')
    throw Error("rank " + std::to_string(world.info.rank) + ": rank 0 failed where every rank waits for it (" + key +
                    "): " + (text.empty() ? std::string("no reason given") : text.substr(1)),
                "rank 0's own error says more");
  return text.substr(1);
}

// Every rank must agree on the run directory; rank 0 picks it and shares it through the store.
// Note [Every rank trains the same config]
// Each machine parses its own command line, so a typo on one of them would otherwise train a job whose
// ranks disagree (a different batch size, model width or learning rate) and fail later in a confusing
// way, or not fail at all. Every rank posts its config to the store; rank 0 compares each with its own
// and posts a verdict that every rank reads, so all of them stop with the same message naming the keys.
void check_same_config(const nlohmann::json& mine, comm::World& world) {
  const int rank = world.info.rank, n = world.info.world_size;
  if (n == 1) return;
  if (rank != 0) world.store->set("cohort/config/" + std::to_string(rank), store_bytes(mine.dump()));
  if (rank == 0) {
    std::string verdict;
    for (int r = 1; r < n && verdict.empty(); ++r) {
      const auto got = world.store->get("cohort/config/" + std::to_string(r));
      const auto theirs = nlohmann::json::parse(std::string(got.begin(), got.end()));
      const auto keys = config::differing_keys(mine, theirs);
      if (keys.empty()) continue;
      verdict = "rank " + std::to_string(r) + " was started with a different config than rank 0:";
      for (const auto& k : keys)
        verdict += " " + k + " = " + (theirs.contains(k) ? theirs[k].dump() : "(absent)") + " on rank " +
                   std::to_string(r) + " but " + (mine.contains(k) ? mine[k].dump() : "(absent)") + " on rank 0;";
      verdict.pop_back();
    }
    world.store->set("cohort/config_verdict", store_bytes(verdict));
  }
  const auto v = world.store->get("cohort/config_verdict");
  if (!v.empty())
    throw ConfigError(std::string(v.begin(), v.end()),
                      "start every machine with the same config file and overrides (only machine-local keys such as "
                      "data.root, run.dir and train.threads may differ)");
}

int agreed_stop_signal(comm::World& world, int mine, int64_t step, bool leaves_alone, c10::Device device) {
  if (world.comm->size() == 1) return mine;
  if (leaves_alone) {
    auto flag = at::full({1}, static_cast<double>(mine), at::kDouble);
    world.comm->broadcast(flag, 0, "a stop request")->wait();
    return static_cast<int>(flag.item<double>());
  }
  // Every step would cost the default job 4% of its time (2 workers on 2 cores, 300 steps: wall 1.038
  // times, median of 5 pairs); every 10 steps, 0.994 (within the noise). A scheduler's warning comes tens
  // of seconds ahead, so waiting up to 9 more steps costs nothing.
  if (step % kStopCheckSteps != 0) return 0;
  // The step has already waited for its loss on the host, so reading the flag back costs no extra sync.
  const auto on = world.comm->backend_name() == "nccl" ? device : c10::Device(c10::kCPU);
  auto flag = at::full({1}, static_cast<float>(mine), at::TensorOptions().dtype(at::kFloat).device(on));
  world.comm->all_reduce(flag, comm::ReduceOp::kMax, "a stop request")->wait();
  return static_cast<int>(flag.item<float>());
}

fs::path agree_run_dir(const TrainConfig& cfg, comm::World& world) {
  return decided_by_rank0(world, "cohort/run_dir", [&] {
    fs::path dir = cfg.run.dir.empty() ? fs::path("runs") / timestamp() : fs::path(cfg.run.dir);
    std::error_code ec;
    fs::create_directories(dir / checkpoint::names::kCheckpointsDir, ec);
    if (ec)
      throw Error("rank 0: cannot create run directory " + dir.string() + ": " + ec.message(),
                  "pass a writable --run-dir");
    return fs::absolute(dir).string();
  });
}

}  // namespace cohort::train

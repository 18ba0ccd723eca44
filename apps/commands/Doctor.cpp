#include "Doctor.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <iostream>
#include <thread>

#include "cohort/comm/Doctor.h"
#include "cohort/comm/PeerWatch.h"
#include "cohort/comm/Rendezvous.h"
#include "cohort/p2p/Auth.h"
#include "cohort/p2p/Transport.h"
#include "cohort/parallel/swarm/SwarmPeer.h"
#include "cohort/store/AuthStore.h"
#include "cohort/util/Error.h"

namespace apps {

namespace {

namespace fs = std::filesystem;

// When rank `rank`'s record in `dirs` was last written, by the file system's clock (min(): none yet; not
// the clock's epoch, which libstdc++ puts in 2174).
// Compared with itself before and after the request: no record is read, and no two machines' clocks meet.
fs::file_time_type written(const std::vector<fs::path>& dirs, int rank) {
  auto newest = fs::file_time_type::min();
  for (const auto& dir : dirs) {
    std::error_code ec;
    const auto t = fs::last_write_time(dir / "flight" / ("rank" + std::to_string(rank) + ".json"), ec);
    if (!ec) newest = std::max(newest, t);
  }
  return newest;
}

// The seconds since `start`, as "1.0".
std::string seconds_since(std::chrono::steady_clock::time_point start) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f",
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return text;
}

// Polls every 100 ms until each of `waiting` wrote its record (`wrote`) or `wait_s` passed since `start`;
// returns those that did not.
template <typename T, typename Wrote>
std::vector<T> still_waiting(std::vector<T> waiting, std::chrono::steady_clock::time_point start, double wait_s,
                             Wrote wrote) {
  const auto deadline = start + std::chrono::duration<double>(wait_s);
  while (!waiting.empty() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    waiting.erase(std::remove_if(waiting.begin(), waiting.end(), wrote), waiting.end());
  }
  return waiting;
}

// Asks every rank of the job running in dirs[0] for its record through the job's store, and waits up to
// `wait_s` for them; says on stderr who answered (stdout stays the diagnosis, JSON under --json).
void ask_every_rank(const std::vector<fs::path>& dirs, double wait_s) {
  const auto [info, backend] = cohort::comm::read_store_address(dirs[0]);
  const std::string where = info.master_addr + ":" + std::to_string(info.master_port);
  std::vector<fs::file_time_type> before;
  for (int r = 0; r < info.world_size; ++r) before.push_back(written(dirs, r));
  uint64_t request = 0;
  try {
    request = cohort::comm::ask_for_flight_records(
        // 5 s: a live job's store answers within that even when busy; a job that has ended refuses at once,
        // and the client retries until then (it waits for a store that is starting, in rendezvous).
        *cohort::comm::communicator_store(backend, cohort::comm::connect_to_store(info, std::chrono::seconds(5))));
  } catch (const std::exception& e) {
    throw cohort::Error("cannot ask the job through its store at " + where + " (from " +
                            (dirs[0] / "flight" / "store.json").string() + "): " + e.what(),
                        "the job may have ended, or rank 0, which hosts the store, may be stopped; then send SIGUSR2 "
                        "to each machine's launcher (docs/doctor.md). Across machines, set COHORT_TOKEN or "
                        "--token-file as for the job");
  }
  std::vector<int> ranks;
  for (int r = 0; r < info.world_size; ++r) ranks.push_back(r);
  const auto start = std::chrono::steady_clock::now();
  const auto waiting = still_waiting(ranks, start, wait_s, [&](int r) { return written(dirs, r) > before[r]; });
  std::cerr << "cohort doctor: asked the job's " << info.world_size << " ranks for their records through its store at "
            << where << " (request " << request << "); " << info.world_size - static_cast<int>(waiting.size())
            << " wrote one within " << seconds_since(start) << " s";
  if (!waiting.empty()) {
    std::cerr << "; none came from rank(s)";
    for (int r : waiting) std::cerr << " " << r;
    std::cerr << ": stopped or frozen (a rank's heartbeat answers within a second otherwise), or its run dir is on "
                 "another machine (copy that RUN_DIR/flight here, or give its run dir too)";
  }
  std::cerr << std::endl;
}

// Note [Asking swarm peers for their records]: each peer whose run dir is given, over the swarm's transport;
// waits up to `wait_s` for each run dir's record and says who answered.
void ask_swarm_peers(const std::vector<fs::path>& dirs, const std::vector<cohort::parallel::swarm::PeerFile>& peers,
                     const std::string& swarm_token, double wait_s) {
  namespace p2p = cohort::p2p;
  const bool insecure = std::all_of(peers.begin(), peers.end(), [](const auto& p) { return p.insecure; });
  if (!insecure && swarm_token.empty())
    throw cohort::Error("asking swarm peers needs a token of their run for the doctor",
                        "issue one: cohort swarm token --key run.key --ttl 1h --out doctor.token, then pass "
                        "--swarm-token doctor.token (not a peer's own token: its frames would race that peer's)");
  const auto identity = insecure ? p2p::issue_token(p2p::insecure_run_key(), std::chrono::hours(1), std::time(nullptr))
                                 : p2p::load_identity(swarm_token);
  std::vector<fs::file_time_type> before;
  for (const auto& d : dirs) before.push_back(written({d}, 0));
  const auto start = std::chrono::steady_clock::now();
  const auto transport = cohort::parallel::swarm::ask_for_records(peers, identity);
  std::vector<size_t> all(dirs.size());
  for (size_t i = 0; i < dirs.size(); ++i) all[i] = i;
  const auto waiting = still_waiting(all, start, wait_s, [&](size_t i) { return written({dirs[i]}, 0) > before[i]; });
  std::cerr << "cohort doctor: asked " << peers.size() << " swarm peer(s) for their records over the swarm; "
            << dirs.size() - waiting.size() << " wrote one within " << seconds_since(start) << " s";
  if (!waiting.empty()) {
    std::cerr << "; none in";
    for (size_t i : waiting) std::cerr << " " << dirs[i].string();
    std::cerr << ": that peer is stopped, frozen or gone (a live peer answers within a second)";
    // A peer refuses a frame whose token is not of its run (in its own log) and sends nothing back, so
    // from here a wrong token looks like silence: say so.
    if (!insecure)
      std::cerr << ", or it refused the --swarm-token given (a token of another run's key, or expired: issue "
                   "one with the run's key, cohort swarm token --key run.key --ttl 1h --out doctor.token)";
  }
  std::cerr << std::endl;
}

}  // namespace

void add_doctor_command(CLI::App& app, DoctorCommand& c) {
  c.app = app.add_subcommand("doctor",
                             "what went wrong in a failed or hung job: reads the flight records its ranks wrote "
                             "(RUN_DIR/flight/) side by side; several run dirs for swarm peers");
  c.app->add_option("run_dirs", c.run_dirs, "run directories")->required();
  c.app->add_flag("--json", c.json, "print the diagnosis as JSON");
  c.app->add_flag("--ask", c.ask,
                  "the job is running (hung or slow): first ask every rank for a fresh record through the job's "
                  "store (its address is in the first RUN_DIR/flight/store.json)");
  c.app->add_option("--wait", c.wait_s, "with --ask: seconds to wait for the ranks' records")->capture_default_str();
  c.app->add_option("--token-file", c.token_file, "with --ask: the job's shared secret, as for train");
  c.app->add_option("--swarm-token", c.swarm_token,
                    "with --ask on an authenticated swarm's run dirs: a token of its run issued for the doctor");
}

int run_doctor_command(const DoctorCommand& c) {
  if (!c.app || !*c.app) return -1;
  std::vector<fs::path> dirs(c.run_dirs.begin(), c.run_dirs.end());
  // The job's secret: as given, else the one a job on one machine left in its run dir (store_token_path).
  if (!c.token_file.empty())
    setenv("COHORT_TOKEN_FILE", fs::absolute(c.token_file).c_str(), 1);
  else if (c.ask && cohort::store::secret_from_env().empty() && fs::exists(cohort::comm::store_token_path(dirs[0])))
    setenv("COHORT_TOKEN_FILE", fs::absolute(cohort::comm::store_token_path(dirs[0])).c_str(), 1);
  if (c.ask) {
    // Swarm peers' run dirs say where each peer listens; a job's, where its store is.
    std::vector<cohort::parallel::swarm::PeerFile> peers;
    for (const auto& d : dirs)
      if (auto p = cohort::parallel::swarm::read_peer_file(d)) peers.push_back(*p);
    if (!peers.empty())
      ask_swarm_peers(dirs, peers, c.swarm_token, c.wait_s);
    else
      ask_every_rank(dirs, c.wait_s);
  }
  const auto diagnosis = cohort::comm::diagnose(cohort::comm::read_flight_dumps(dirs));
  if (c.json)
    std::cout << diagnosis.dump(2) << std::endl;
  else
    std::cout << cohort::comm::render(diagnosis);
  return diagnosis["findings"].empty() ? 0 : 1;
}

}  // namespace apps

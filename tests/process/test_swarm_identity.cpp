// Misconfigured swarm peers are named and stopped, not left to train alone (Note [A peer that is alone
// says why] in parallel/swarm/SwarmPeer.cpp): one token in two processes, a token of another run; and a
// peer that crashed and restarts with its own token is still let back in.
#include <gtest/gtest.h>

#include <signal.h>

#include <thread>

#include "process/Harness.h"
#include "process/SwarmPeers.h"

namespace cohort::testing {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

fs::path make_key(const fs::path& dir, const std::string& name) {
  const auto key = dir / name;
  const auto r = run_cohort({"swarm", "keygen", "--out", key.string()});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return key;
}

fs::path make_token(const fs::path& key, const std::string& name) {
  const auto token = key.parent_path() / name;
  const auto r = run_cohort({"swarm", "token", "--key", key.string(), "--ttl", "1h", "--out", token.string()});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return token;
}

// A peer with its own token on 127.0.0.<host>, joining through <bootstrap> (0: none), training slowly
// for long enough that the test decides when it ends; alone, it steps without waiting for company.
std::vector<std::string> token_peer(const fs::path& dir, int host, int bootstrap, const fs::path& token,
                                    int64_t steps = 100000) {
  std::vector<std::string> a = {"--nproc-per-node",
                                "1",
                                "dist.strategy=swarm",
                                "swarm.token=" + token.string(),
                                "swarm.listen=" + address(host),
                                "swarm.matchmaking_s=2",
                                "swarm.min_group_size=1",
                                "train.max_steps=" + std::to_string(steps),
                                "train.epochs=100000",
                                "train.threads=1",
                                "log.progress=plain",
                                "log.every_steps=1"};
  if (bootstrap > 0) a.push_back("swarm.initial_peers=" + address(bootstrap));
  return quick_args(dir, a);
}

bool wait_for(const Proc& p, const std::string& text, std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (p.output_so_far().find(text) != std::string::npos) return true;
    std::this_thread::sleep_for(100ms);
  }
  return false;
}

// Waits until `p` has logged `count` training steps of its own (wherever it started: a peer that caught
// up starts at the swarm's step).
bool wait_for_steps(const Proc& p, size_t count, std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    const auto out = p.output_so_far();
    size_t n = 0;
    for (auto at = out.find(" loss "); at != std::string::npos; at = out.find(" loss ", at + 1)) ++n;
    if (n >= count) return true;
    std::this_thread::sleep_for(100ms);
  }
  return false;
}

// The same token file given to a second process: it learns that the identity is live elsewhere, stops
// with the fix, and the first goes on (it logged that the other was told).
TEST(Swarm, ASecondProcessWithTheSameTokenIsRefusedAndStops) {
  SKIP_WITHOUT_SWARM();
  const auto dir = fresh_dir("swarm-same-token");
  const auto token = make_token(make_key(dir, "run.key"), "peer.token");
  Proc first(cohort_argv(token_peer(dir / "a", 60, 0, token)), slow_steps());
  ASSERT_TRUE(wait_for(first, " step 2/", 120s)) << first.output_so_far();
  // With swarm.announce_s=3 the second waits up to 15 s (5 of them) for live peers at start; it learns in
  // its first read that its identity is taken, and stops then, not when that patience runs out.
  auto twin = token_peer(dir / "b", 61, 60, token);
  twin.push_back("swarm.announce_s=3");
  const auto second = cohort_train(twin, 60, slow_steps());
  EXPECT_NE(second.exit_code, 0) << second.output;
  EXPECT_LT(second.seconds, 15.0) << second.output;
  EXPECT_NE(second.output.find("is already live at " + address(60)), std::string::npos) << second.output;
  EXPECT_NE(second.output.find("cohort swarm token --key"), std::string::npos) << second.output;
  EXPECT_NE(first.output_so_far().find("another process at " + address(61) + " uses this peer's identity"),
            std::string::npos)
      << first.output_so_far();
  // The first is unharmed: it still trains.
  const auto steps = first.output_so_far().rfind(" step ");
  EXPECT_TRUE(
      wait_for(first, " step " + std::to_string(std::stoll(first.output_so_far().substr(steps + 6)) + 3) + "/", 60s))
      << first.output_so_far();
}

// A peer killed (no goodbye: its record lives on for swarm.peer_ttl_s) and restarted at once with its own
// token and address is its own successor, not a second process: it rejoins and catches up.
TEST(Swarm, APeerKilledAndRestartedWithItsOwnTokenRejoins) {
  SKIP_WITHOUT_SWARM();
  const auto dir = fresh_dir("swarm-restart-token");
  const auto key = make_key(dir, "run.key");
  const auto a_token = make_token(key, "a.token"), b_token = make_token(key, "b.token");
  Proc a(cohort_argv(token_peer(dir / "a", 62, 0, a_token)), slow_steps());
  ASSERT_TRUE(wait_for(a, " step 1/", 120s)) << a.output_so_far();
  {
    Proc b(cohort_argv(token_peer(dir / "b", 63, 62, b_token)), slow_steps());
    ASSERT_TRUE(wait_for_steps(b, 5, 120s)) << b.output_so_far();
    ::kill(b.pid(), SIGKILL);
    b.wait(30);
  }
  Proc again(cohort_argv(token_peer(dir / "b2", 63, 62, b_token)), slow_steps());
  EXPECT_TRUE(wait_for(again, "swarm: caught up to step ", 90s)) << again.output_so_far();
  // Past the download it trains on beside the first peer.
  EXPECT_TRUE(wait_for_steps(again, 10, 120s)) << again.output_so_far();
  const auto out = again.output_so_far();
  EXPECT_EQ(out.find("already live"), std::string::npos) << out;
  EXPECT_EQ(a.output_so_far().find("another process at"), std::string::npos) << a.output_so_far();
}

// A token made with another run's key: the peers of this run refuse it, and tell it so; it stops naming
// both run keys and the fix, instead of training alone.
TEST(Swarm, APeerWithAnotherRunsTokenIsToldWhyAndStops) {
  SKIP_WITHOUT_SWARM();
  const auto dir = fresh_dir("swarm-other-run");
  const auto ours = make_token(make_key(dir, "run.key"), "a.token");
  const auto theirs = make_token(make_key(dir, "other-run.key"), "w.token");
  Proc a(cohort_argv(token_peer(dir / "a", 64, 0, ours)), slow_steps());
  ASSERT_TRUE(wait_for(a, " step 1/", 120s)) << a.output_so_far();
  // As the twin above: told in its first read, it stops before its 15 s of patience run out.
  auto stranger = token_peer(dir / "w", 65, 64, theirs);
  stranger.push_back("swarm.announce_s=3");
  const auto w = cohort_train(stranger, 60, slow_steps());
  EXPECT_NE(w.exit_code, 0) << w.output;
  EXPECT_LT(w.seconds, 15.0) << w.output;
  EXPECT_NE(w.output.find("refuse this peer (peer "), std::string::npos) << w.output;
  EXPECT_NE(w.output.find(address(64)), std::string::npos) << w.output;
  EXPECT_NE(w.output.find("cohort swarm token --key <that run's run.key>"), std::string::npos) << w.output;
  EXPECT_NE(a.output_so_far().find("its token belongs to another run"), std::string::npos) << a.output_so_far();
}

// Nobody at swarm.initial_peers: after 30 s alone the peer says so, naming where it looked and what to
// check, and trains on (the others may come later). Label swarm: it takes those 30 s.
TEST(SwarmLong, APeerWhoseInitialPeersNeverAnswerWarnsAndTrainsOn) {
  SKIP_WITHOUT_SWARM();
  const auto dir = fresh_dir("swarm-alone");
  const auto token = make_token(make_key(dir, "run.key"), "peer.token");
  Proc alone(cohort_argv(token_peer(dir / "a", 66, 67, token)), slow_steps());
  const std::string warning = "WARNING: this peer has known no live peer for ";
  ASSERT_TRUE(wait_for(alone, warning, 90s)) << alone.output_so_far();
  const auto out = alone.output_so_far();
  const auto at = out.find(warning);
  EXPECT_GE(std::stoll(out.substr(at + warning.size())), 30) << out;
  EXPECT_NE(out.find("swarm.initial_peers=" + address(67), at), std::string::npos) << out;
  // It goes on training after the warning.
  const auto last = out.rfind(" step ");
  EXPECT_TRUE(wait_for(alone, " step " + std::to_string(std::stoll(out.substr(last + 6)) + 2) + "/", 60s))
      << alone.output_so_far();
}

// `cohort doctor --ask` on an authenticated swarm (Note [Asking swarm peers for their records]): without a
// token it stops and says how to issue one; with a doctor's token of the run both peers write a fresh
// record; with a token of another run the peers refuse the request, and doctor names the run dirs that got
// none. Label swarm: about 30 s.
TEST(SwarmLong, DoctorAsksAnAuthenticatedSwarmWithATokenOfItsRun) {
  SKIP_WITHOUT_SWARM();
  const auto dir = fresh_dir("swarm-doctor-token");
  const auto key = make_key(dir, "run.key");
  const auto a_token = make_token(key, "a.token"), b_token = make_token(key, "b.token");
  const auto doctor_token = make_token(key, "doctor.token");
  const auto strangers = make_token(make_key(dir, "other-run.key"), "stranger.token");
  Proc a(cohort_argv(token_peer(dir / "a", 68, 0, a_token)), slow_steps());
  ASSERT_TRUE(wait_for(a, " step 1/", 120s)) << a.output_so_far();
  Proc b(cohort_argv(token_peer(dir / "b", 69, 68, b_token)), slow_steps());
  ASSERT_TRUE(wait_for_steps(b, 3, 120s)) << b.output_so_far();
  const std::vector<std::string> dirs = {(dir / "a").string(), (dir / "b").string()};
  auto ask = [&](std::vector<std::string> extra, double wait_s) {
    std::vector<std::string> argv = {COHORT_BINARY, "doctor", "--ask", "--wait", std::to_string(wait_s)};
    argv.insert(argv.end(), extra.begin(), extra.end());
    argv.insert(argv.end(), dirs.begin(), dirs.end());
    return run(argv, 90.0);
  };

  const auto untokened = ask({}, 5);
  EXPECT_NE(untokened.exit_code, 0) << untokened.output;
  EXPECT_NE(untokened.output.find("asking swarm peers needs a token of their run for the doctor"), std::string::npos)
      << untokened.output;
  EXPECT_NE(untokened.output.find("--swarm-token doctor.token"), std::string::npos) << untokened.output;

  const auto asked = ask({"--swarm-token", doctor_token.string()}, 30);
  EXPECT_NE(asked.output.find("asked 2 swarm peer(s) for their records over the swarm; 2 wrote one within"),
            std::string::npos)
      << asked.output;
  for (const auto& d : dirs)
    EXPECT_EQ(read_json(fs::path(d) / "flight" / "rank0.json")["reason"], "asked by cohort doctor --ask") << d;

  const auto refused = ask({"--swarm-token", strangers.string()}, 5);
  EXPECT_NE(refused.output.find("0 wrote one within"), std::string::npos) << refused.output;
  EXPECT_NE(refused.output.find(dirs[0]), std::string::npos) << refused.output;
  EXPECT_NE(refused.output.find("or it refused the --swarm-token given (a token of another run's key"),
            std::string::npos)
      << refused.output;
}

}  // namespace
}  // namespace cohort::testing

// comm/FlightRecorder (each rank's last collectives) and comm/Doctor (what `cohort doctor` makes of the
// ranks' records side by side), on records built here: a stopped rank, a rank elsewhere, a desync, a
// straggler, and a healthy job. The process test Failures.AStoppedWorkerIsNamedWithinTheTimeout checks the
// same against a real job.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>

#include <signal.h>

#include <ATen/ATen.h>

#include "cohort/comm/Doctor.h"
#include "cohort/comm/FlightRecorder.h"
#include "cohort/util/Error.h"

using cohort::comm::FlightRecorder;
using nlohmann::json;

namespace {

// Collectives 1..n, every one completed, as each rank of a healthy ddp job records them.
std::unique_ptr<FlightRecorder> healthy(uint64_t n) {
  auto rec = std::make_unique<FlightRecorder>(100);
  for (uint64_t s = 1; s <= n; ++s) {
    rec->issued(s, "all_reduce", "gradient bucket " + std::to_string(s % 3), at::zeros({256}));
    rec->ended(s, true);
  }
  return rec;
}

// A running rank's record, written `s` seconds after it was built (Note [A record of a rank still running]).
json written_later(json d, double s) {
  d["written_unix"] = d["written_unix"].get<double>() + s;
  return d;
}

std::vector<std::string> kinds(const json& d) {
  std::vector<std::string> k;
  for (const auto& f : d["findings"]) k.push_back(f["kind"]);
  return k;
}

}  // namespace

TEST(FlightRecorder, KeepsTheLastCollectivesInOrderWithTheirState) {
  FlightRecorder rec(4);
  cohort::comm::set_current_phase("backward");
  for (uint64_t s = 1; s <= 6; ++s) rec.issued(s, "all_reduce", "gradient bucket", at::zeros({10}, at::kBFloat16));
  rec.ended(5, true);
  rec.ended(6, false);
  const json d = rec.to_json(1, 2, "SIGUSR2");
  EXPECT_EQ(d["format"], cohort::comm::kFlightFormat);
  EXPECT_EQ(d["version"], cohort::comm::kFlightVersion);
  EXPECT_EQ(d["rank"], 1);
  EXPECT_EQ(d["recorded"], 6);
  ASSERT_EQ(d["entries"].size(), 4u);
  EXPECT_EQ(d["entries"][0]["seq"], 3);
  EXPECT_EQ(d["entries"][3]["seq"], 6);
  EXPECT_EQ(d["entries"][0]["state"], "issued");
  EXPECT_EQ(d["entries"][2]["state"], "completed");
  EXPECT_EQ(d["entries"][3]["state"], "failed");
  EXPECT_EQ(d["entries"][3]["dtype"], "BFloat16");
  EXPECT_EQ(d["entries"][3]["numel"], 10);
  EXPECT_EQ(d["entries"][3]["phase"], "backward");
  rec.resize(0);  // dist.flight_records=0
  rec.issued(7, "barrier", "end", at::Tensor());
  EXPECT_TRUE(rec.to_json(1, 2, "x")["entries"].empty());
}

TEST(FlightRecorder, WritesARecordThatDoctorReadsAndRefusesAnotherFile) {
  const auto dir = std::filesystem::temp_directory_path() / "cohort-flight-test";
  std::filesystem::remove_all(dir);
  const auto path = healthy(3)->write(dir, 0, 1, "error");
  EXPECT_EQ(path, dir / "flight" / "rank0.json");
  const auto dumps = cohort::comm::read_flight_dumps({dir});
  ASSERT_EQ(dumps.size(), 1u);
  EXPECT_EQ(dumps[0]["entries"].size(), 3u);
  std::ofstream(dir / "flight" / "rank1.json") << R"({"format": "something-else", "version": 1})";
  EXPECT_THROW(cohort::comm::read_flight_dumps({dir}), cohort::Error);
  EXPECT_THROW(cohort::comm::read_flight_dumps({dir / "none"}), cohort::Error);
  std::filesystem::remove_all(dir);
}

TEST(Doctor, NamesTheRankWithoutARecordAndTheCollectiveTheOthersWaitedIn) {
  // Three ranks; rank 2 was SIGSTOPped: ranks 0 and 1 entered #11 and it timed out.
  std::vector<json> dumps;
  for (int r = 0; r < 2; ++r) {
    auto rec = healthy(10);
    rec->issued(11, "all_reduce", "gradient bucket 1", at::zeros({256}));
    rec->ended(11, false);
    dumps.push_back(rec->to_json(r, 3, "error"));
  }
  const json d = cohort::comm::diagnose(dumps);
  ASSERT_EQ(kinds(d), (std::vector<std::string>{"no_record", "never_ended"})) << d.dump(1);
  EXPECT_EQ(d["findings"][0]["ranks"], json({2}));
  EXPECT_NE(d["findings"][0]["text"].get<std::string>().find("rank 2 left no flight record"), std::string::npos);
  EXPECT_EQ(d["findings"][1]["seq"], 11);
  EXPECT_NE(d["findings"][1]["text"].get<std::string>().find("#11 all_reduce 'gradient bucket 1'"), std::string::npos);
  EXPECT_NE(d["findings"][1]["text"].get<std::string>().find("the ranks without a record are the likely cause"),
            std::string::npos);
}

// Note [A crashed rank writes its record]: in a child process that aborts, the record is on disk before
// the signal ends it, with the signal as its reason, and the child still dies of that signal.
TEST(FlightRecorder, AnAbortingProcessWritesItsRecordAndStillDiesOfTheSignal) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  // A name of its own, not the pid's: this style runs the child as a new process of the test binary.
  const auto dir = std::filesystem::temp_directory_path() / "cohort-flight-abort";
  std::filesystem::remove_all(dir);
  EXPECT_EXIT(
      {
        std::shared_ptr<FlightRecorder> rec = healthy(4);
        cohort::comm::FlightDumps dumps(rec, dir, 1, 2);
        cohort::comm::set_current_phase("backward");
        std::abort();
      },
      ::testing::KilledBySignal(SIGABRT), "");
  const auto dumps = cohort::comm::read_flight_dumps({dir});
  ASSERT_EQ(dumps.size(), 1u);
  EXPECT_EQ(dumps[0]["reason"], "SIGABRT");
  EXPECT_EQ(dumps[0]["phase"], "backward");
  EXPECT_EQ(dumps[0]["entries"].size(), 4u);
  std::filesystem::remove_all(dir);
}

TEST(Doctor, NamesARankThatCrashedAndWhereItWas) {
  auto survivor = healthy(10);
  survivor->issued(11, "all_reduce", "gradient bucket 1", at::zeros({256}));
  survivor->ended(11, false);
  cohort::comm::set_current_phase("backward");
  const json d = cohort::comm::diagnose({survivor->to_json(0, 2, "error"), healthy(10)->to_json(1, 2, "SIGSEGV")});
  ASSERT_EQ(kinds(d), (std::vector<std::string>{"crashed", "never_issued"})) << d.dump(1);
  EXPECT_EQ(d["findings"][0]["ranks"], json({1}));
  const auto text = d["findings"][0]["text"].get<std::string>();
  EXPECT_NE(text.find("rank 1 crashed (SIGSEGV) in phase 'backward', after #10 all_reduce"), std::string::npos) << text;
}

// Rank 0 issued #11 (a broadcast it never waited for: #12 failed first, and the error skipped the wait),
// rank 1 completed it: #11 did not stall, and is not reported as if it had.
TEST(Doctor, ACollectiveNeverWaitedForIsNotOneThatStalled) {
  auto r0 = healthy(10), r1 = healthy(10);
  r0->issued(11, "broadcast", "DDP buffers from rank 0", at::zeros({9}));
  r1->issued(11, "broadcast", "DDP buffers from rank 0", at::zeros({9}));
  r1->ended(11, true);
  r0->issued(12, "all_reduce", "gradient bucket 0", at::zeros({256}));
  r0->ended(12, false);
  r1->issued(12, "all_reduce", "gradient bucket 0", at::zeros({256}));
  r1->ended(12, false);
  const json d = cohort::comm::diagnose({r0->to_json(0, 2, "error"), r1->to_json(1, 2, "error")});
  ASSERT_EQ(kinds(d), (std::vector<std::string>{"never_ended"})) << d.dump(1);
  EXPECT_EQ(d["findings"][0]["seq"], 12) << d.dump(1);
}

// Note [A swarm peer's rounds in its record]: peers aaaa and bbbb averaged with cccc until step 6, where
// cccc sent nothing; cccc's run dir holds no record. Doctor names cccc, the step, who noticed, and the dir.
TEST(Doctor, NamesTheSwarmPeerTheOthersRoundsFoundSilent) {
  std::vector<json> dumps;
  for (const std::string name : {"aaaa", "bbbb"}) {
    FlightRecorder rec(10);
    rec.set_peer(name);
    for (int64_t step = 4; step <= 7; ++step) {
      rec.round_began(step, "average");
      const bool gone = step >= 6;
      rec.round_ended(step,
                      gone && step == 7 ? std::vector<std::string>{"aaaa", "bbbb"}
                                        : std::vector<std::string>{"aaaa", "bbbb", "cccc"},
                      step == 6 ? std::vector<std::string>{"cccc"} : std::vector<std::string>{},
                      step == 6 ? "no result from cccc" : "");
    }
    dumps.push_back(rec.to_json(0, 1, "a swarm round with a silent member"));
  }
  dumps.push_back({{"run_dir", "/runs/peer2"}, {"no_record", true}});
  const json d = cohort::comm::diagnose(dumps);
  ASSERT_EQ(kinds(d), (std::vector<std::string>{"silent_peer"})) << d.dump(1);
  EXPECT_EQ(d["findings"][0]["peers"], json({"cccc"}));
  EXPECT_EQ(d["findings"][0]["seq"], 6);
  const auto text = d["findings"][0]["text"].get<std::string>();
  EXPECT_NE(text.find("swarm peer cccc went silent from step 6: peers aaaa and bbbb"), std::string::npos) << text;
  EXPECT_NE(text.find("run dirs without one: /runs/peer2"), std::string::npos) << text;
  const auto shown = cohort::comm::render(d);
  EXPECT_NE(shown.find("step 6 average with aaaa, bbbb and cccc: failed (no result from cccc)"), std::string::npos)
      << shown;
  // With cccc's own record, written as it left at step 5, that is said instead.
  FlightRecorder own(10);
  own.set_peer("cccc");
  own.round_began(5, "average");
  own.round_ended(5, {"aaaa", "bbbb", "cccc"}, {}, "");
  dumps.back() = own.to_json(0, 1, "SIGUSR2");
  const auto with_own = cohort::comm::diagnose(dumps)["findings"][0]["text"].get<std::string>();
  EXPECT_NE(with_own.find("its own record (written on SIGUSR2) ends at step 5"), std::string::npos) << with_own;
}

TEST(Doctor, NamesARankThatWasDoingSomethingElseAndWhat) {
  auto ahead = healthy(10);
  ahead->issued(11, "all_reduce", "gradient bucket 1", at::zeros({256}));
  ahead->ended(11, false);
  cohort::comm::set_current_phase("checkpoint");
  const json d =
      cohort::comm::diagnose({ahead->to_json(0, 2, "error"), written_later(healthy(10)->to_json(1, 2, "SIGUSR2"), 5)});
  ASSERT_EQ(kinds(d), (std::vector<std::string>{"never_issued"})) << d.dump(1);
  const auto text = d["findings"][0]["text"].get<std::string>();
  EXPECT_EQ(d["findings"][0]["ranks"], json({1}));
  EXPECT_NE(text.find("rank 1 never issued collective #11 all_reduce 'gradient bucket 1'"), std::string::npos) << text;
  EXPECT_NE(text.find("its last was #10"), std::string::npos) << text;
  EXPECT_NE(text.find("phase 'checkpoint'"), std::string::npos) << text;
}

// Note [A record of a rank still running]: records asked of a healthy job mid-step, rank 0 a collective
// ahead of rank 1 and both inside one, are nothing; the same records written 5 s later are a hang.
TEST(Doctor, ARunningJobAskedMidStepIsNothingUntilItsCollectivesHaveWaited) {
  auto r0 = healthy(10), r1 = healthy(10);
  for (auto* r : {r0.get(), r1.get()}) r->issued(11, "all_reduce", "gradient bucket 0", at::zeros({256}));
  r0->ended(11, true);
  r0->issued(12, "all_reduce", "gradient bucket 1", at::zeros({256}));
  const std::string asked = "asked through the store (cohort doctor --ask)";
  EXPECT_TRUE(cohort::comm::diagnose({r0->to_json(0, 2, asked), r1->to_json(1, 2, asked)})["findings"].empty());
  const json hung =
      cohort::comm::diagnose({written_later(r0->to_json(0, 2, asked), 5), written_later(r1->to_json(1, 2, asked), 5)});
  ASSERT_EQ(kinds(hung), (std::vector<std::string>{"never_issued", "never_ended"})) << hung.dump(1);
  EXPECT_EQ(hung["findings"][0]["ranks"], json({1}));
  EXPECT_EQ(hung["findings"][0]["seq"], 12);
  EXPECT_EQ(hung["findings"][1]["ranks"], json({1}));
  EXPECT_EQ(hung["findings"][1]["seq"], 11);
}

TEST(Doctor, NamesTheFirstCollectiveThatDiffersBetweenRanks) {
  FlightRecorder a(10), b(10);
  for (uint64_t s = 1; s <= 4; ++s) {
    a.issued(s, "all_reduce", "bucket", at::zeros({8}));
    b.issued(s, s == 3 ? "broadcast" : "all_reduce", "bucket", at::zeros({s == 3 ? 4 : 8}));
    a.ended(s, true);
    b.ended(s, true);
  }
  const json d = cohort::comm::diagnose({a.to_json(0, 2, "error"), b.to_json(1, 2, "error")});
  ASSERT_FALSE(d["findings"].empty());
  EXPECT_EQ(d["findings"][0]["kind"], "differs");
  EXPECT_EQ(d["findings"][0]["seq"], 3);
  const auto text = d["findings"][0]["text"].get<std::string>();
  EXPECT_NE(text.find("rank 1 called #3 broadcast 'bucket' (Float x 4)"), std::string::npos) << text;
}

// Note [Which rank is out of step]: steps of two buckets; `skip` leaves bucket 0 of step 3 out, `barrier`
// enters a checkpoint barrier before step 3. Each rank's record holds its calls, numbered as it made them.
std::unique_ptr<FlightRecorder> buckets(bool skip, bool barrier) {
  auto r = std::make_unique<FlightRecorder>(32);
  uint64_t seq = 0;
  const auto call = [&](const char* op, const std::string& what, int64_t n) {
    r->issued(++seq, op, what, n > 0 ? at::zeros({n}) : at::Tensor());  // a barrier moves no tensor
    r->ended(seq, true);
  };
  for (int step = 1; step <= 4; ++step) {
    if (barrier && step == 3) call("barrier", "checkpoint step-3: begin", 0);
    if (!(skip && step == 3)) call("all_reduce", "gradient bucket 0", 64);
    call("all_reduce", "gradient bucket 1", 32);
  }
  return r;
}

TEST(Doctor, OfThreeRanksTheOneThatSkippedABucketIsNamed) {
  const json d = cohort::comm::diagnose({buckets(false, false)->to_json(0, 3, "error"),
                                         buckets(true, false)->to_json(1, 3, "error"),
                                         buckets(false, false)->to_json(2, 3, "error")});
  ASSERT_FALSE(d["findings"].empty()) << d.dump(1);
  EXPECT_EQ(d["findings"][0]["kind"], "differs");
  EXPECT_EQ(d["findings"][0]["seq"], 5);
  EXPECT_EQ(d["findings"][0]["ranks"], json({1}));
  const auto text = d["findings"][0]["text"].get<std::string>();
  EXPECT_NE(text.find("rank 1 is out of step: it skipped #5 all_reduce 'gradient bucket 0' (Float x 64), which the "
                      "others called (rank 1's #5 is their #6)"),
            std::string::npos)
      << text;
}

TEST(Doctor, OfThreeRanksTheOneInAnExtraBarrierIsNamed) {
  const json d = cohort::comm::diagnose({buckets(false, false)->to_json(0, 3, "error"),
                                         buckets(false, false)->to_json(1, 3, "error"),
                                         buckets(false, true)->to_json(2, 3, "error")});
  ASSERT_FALSE(d["findings"].empty()) << d.dump(1);
  EXPECT_EQ(d["findings"][0]["ranks"], json({2}));
  const auto text = d["findings"][0]["text"].get<std::string>();
  EXPECT_NE(text.find("rank 2 is out of step: it called #5 barrier 'checkpoint step-3: begin', which the others did "
                      "not (rank 2's #6 is their #5)"),
            std::string::npos)
      << text;
}

// Of two ranks neither is the reference: the shift is stated both ways, and both ranks are named.
TEST(Doctor, OfTwoRanksTheShiftIsStatedBothWays) {
  const json d = cohort::comm::diagnose(
      {buckets(false, false)->to_json(0, 2, "error"), buckets(true, false)->to_json(1, 2, "error")});
  ASSERT_FALSE(d["findings"].empty()) << d.dump(1);
  EXPECT_EQ(d["findings"][0]["ranks"], json({0, 1}));
  const auto text = d["findings"][0]["text"].get<std::string>();
  EXPECT_NE(text.find("rank 1's #5 is rank 0's #6: rank 1 skipped #5 all_reduce 'gradient bucket 0' (Float x 64), "
                      "or rank 0 called it in addition (with two ranks the records cannot tell which)"),
            std::string::npos)
      << text;
}

double now_unix() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

// `n` collectives of rank `rank`, `per_step` a step, steps 50 ms apart, entered `late_s` into the step and
// ended `open_s` after that.
// Every rank's steps begin at `t0`, the test's one start instant: each record's own first issue would put a
// second rank late by however long building the first took, which a slow build (a sanitizer's) makes
// longer than the 1 ms margins below.
json stepped(int rank, uint64_t n, uint64_t per_step, double late_s, double open_s, double t0) {
  json d = healthy(n)->to_json(rank, 2, "SIGUSR2");
  for (size_t i = 0; i < d["entries"].size(); ++i) {
    const double entered = t0 + 0.050 * static_cast<double>(i / per_step) + late_s;
    d["entries"][i]["issued_unix"] = entered;
    d["entries"][i]["ended_unix"] = entered + open_s;
  }
  return d;
}

// Three collectives a step in flight together (a step's buffer broadcasts and its bucket), each entered by
// the slow rank 30 ms late: the fast rank waited 30 ms a step, not 90. 33 steps of 50 ms: 0.99 s of 1.63 s.
TEST(Doctor, AStragglersWaitOverCollectivesInFlightTogetherCountsOnce) {
  const double t0 = now_unix();
  const json d = cohort::comm::diagnose({stepped(0, 99, 3, 0, 0.031, t0), stepped(1, 99, 3, 0.030, 0.001, t0)});
  ASSERT_EQ(kinds(d), (std::vector<std::string>{"straggler"})) << d.dump(1);
  const auto text = d["findings"][0]["text"].get<std::string>();
  EXPECT_NE(text.find("rank 1 kept the others waiting 1.0 s of the last 1.6 s (61%): it entered 99 of 99"),
            std::string::npos)
      << text;
}

// DDP's step: the buffers' broadcast as backward begins, then two buckets 10 ms apart as their gradients
// are ready; the rank waits for all three once it has issued the last. The slow rank issues each 25 ms
// later. The fast rank waited 25 ms a step (from its last issue to the slow rank's), not the 45 ms its
// broadcast was open, 90% (Note [When a rank waited for a straggler]). 33 steps of 50 ms: 0.83 s of 1.65 s.
TEST(Doctor, AStragglersWaitCountsFromTheLastIssueBeforeTheWait) {
  const double start = now_unix();
  json fast = stepped(0, 99, 3, 0, 0, start), slow = stepped(1, 99, 3, 0, 0, start);
  const double t0 = fast["entries"][0]["issued_unix"].get<double>();
  for (size_t i = 0; i < 99; ++i) {
    const double step_began = t0 + 0.050 * static_cast<double>(i / 3), in_step = 0.010 * static_cast<double>(i % 3);
    fast["entries"][i]["issued_unix"] = step_began + in_step;
    fast["entries"][i]["ended_unix"] = step_began + 0.020 + 0.025 + 0.001;  // the slow rank's last bucket, then 1 ms
    slow["entries"][i]["issued_unix"] = step_began + 0.025 + in_step;
    slow["entries"][i]["ended_unix"] = step_began + 0.025 + in_step + 0.001;
  }
  const json d = cohort::comm::diagnose({fast, slow});
  ASSERT_EQ(kinds(d), (std::vector<std::string>{"straggler"})) << d.dump(1);
  const auto text = d["findings"][0]["text"].get<std::string>();
  EXPECT_NE(text.find("rank 1 kept the others waiting 0.8 s of the last 1.6 s (50%): it entered 99 of 99 collectives "
                      "last, a median of 25.0 ms"),
            std::string::npos)
      << text;
}

TEST(Doctor, NamesARankThatIsAlwaysTheLastToEnterAndNothingInAHealthyJob) {
  // One collective every 50 ms (a step's), each entered by the slow rank 30 ms after the fast one.
  // An all-reduce ends once the last rank has entered it: the fast rank's 1 ms after the slow one's entry.
  const double t0 = now_unix();
  const json fast = stepped(0, 40, 1, 0, 0.031, t0), slow = stepped(1, 40, 1, 0.030, 0.001, t0);
  const json base = stepped(0, 40, 1, 0, 0.001, t0);  // the same, ended before the slow rank entered
  const json d = cohort::comm::diagnose({fast, slow});
  ASSERT_EQ(kinds(d), (std::vector<std::string>{"straggler"})) << d.dump(1);
  EXPECT_EQ(d["findings"][0]["ranks"], json({1}));
  EXPECT_NE(d["findings"][0]["text"].get<std::string>().find("a median of 30"), std::string::npos);
  // Collectives that had ended on the fast rank before the slow one entered them (a broadcast's root,
  // done once it has sent) kept nobody waiting: nothing to say.
  EXPECT_TRUE(cohort::comm::diagnose({base, slow})["findings"].empty()) << cohort::comm::diagnose({base, slow}).dump(1);
  // The same records without the delay: nothing to say.
  json same = base;
  same["rank"] = 1;
  EXPECT_TRUE(cohort::comm::diagnose({base, same})["findings"].empty());
  EXPECT_NE(cohort::comm::render(cohort::comm::diagnose({base, same})).find("nothing stands out"), std::string::npos);
}

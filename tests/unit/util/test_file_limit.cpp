// util/FileLimit: a job's ranks raise their open-file limit to what the system allows, and a job too
// large for it stops at the rendezvous naming both numbers, instead of failing inside Gloo's connect.
#include <gtest/gtest.h>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>

#include "cohort/comm/Rendezvous.h"
#include "cohort/util/Error.h"
#include "cohort/util/FileLimit.h"

using cohort::util::open_file_shortfall;

TEST(FileLimit, ASmallJobFitsTheUsualLimit) {
  EXPECT_FALSE(open_file_shortfall(0, 1, true, 64));
  EXPECT_FALSE(open_file_shortfall(0, 32, true, 1024));
  EXPECT_FALSE(open_file_shortfall(5, 512, false, 1024));
}

TEST(FileLimit, AThousandRanksNeedMoreThanTheUsualLimitAndTheMessageSaysHowMany) {
  const auto worker = open_file_shortfall(3, 1024, false, 1024);
  ASSERT_TRUE(worker);
  EXPECT_EQ(*worker,
            "rank 3 of 1024 needs about 1087 open files (a socket for each other rank), but this process may open "
            "1024 (the hard limit of ulimit -n)");
  // The store's host also holds a connection or two for each rank.
  const auto host = open_file_shortfall(0, 1024, true, 2048);
  ASSERT_TRUE(host);
  EXPECT_NE(host->find("needs about 3135 open files"), std::string::npos) << *host;
  EXPECT_NE(host->find("the store's connections"), std::string::npos) << *host;
  EXPECT_FALSE(open_file_shortfall(0, 1024, true, 1 << 20));
}

TEST(FileLimit, TheSoftLimitIsRaisedToTheHardOne) {
  rlimit before{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &before), 0);
  const uint64_t limit = cohort::util::raise_open_file_limit();
  rlimit after{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &after), 0);
  EXPECT_GE(after.rlim_cur, before.rlim_cur);
  if (before.rlim_max != RLIM_INFINITY) {
    EXPECT_EQ(after.rlim_cur, before.rlim_max);
    EXPECT_EQ(limit, before.rlim_max);
  }
}

// In a child process, whose limits the test may lower for good: a rank of a 1,024-rank job under a hard
// limit of 256 stops at once with the fix, before it tries to reach any store.
TEST(FileLimit, ARendezvousTooLargeForTheLimitStopsAtOnceAndSaysWhatToRaise) {
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    rlimit low{256, 256};
    if (setrlimit(RLIMIT_NOFILE, &low) != 0) _exit(2);
    cohort::comm::WorldInfo info;
    info.rank = 7;
    info.world_size = 1024;
    info.master_addr = "127.0.0.1";
    info.master_port = 1;  // nothing listens there: reaching it would fail differently
    try {
      cohort::comm::rendezvous(info, "gloo", std::chrono::seconds(5));
    } catch (const cohort::CommError& e) {
      const std::string what = e.what(), hint = e.hint();
      const bool named = what.find("rank 7 of 1024 needs about 1087 open files") != std::string::npos &&
                         what.find("may open 256") != std::string::npos &&
                         hint.find("LimitNOFILE=") != std::string::npos;
      _exit(named ? 0 : 3);
    } catch (...) {
      _exit(4);
    }
    _exit(5);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "2: setrlimit failed, 3: another message, 4: another error, 5: no error";
}

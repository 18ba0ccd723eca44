#include <gtest/gtest.h>

#include "cohort/comm/WorldInfo.h"
#include "cohort/train/Setup.h"
#include "cohort/util/Error.h"

using cohort::comm::EnvMap;
using cohort::comm::world_from_env;

TEST(WorldInfo, NoLauncherIsOneProcess) {
  const auto w = world_from_env({});
  EXPECT_EQ(w.launcher, "none");
  EXPECT_EQ(w.world_size, 1);
}

TEST(WorldInfo, Torchrun) {
  const auto w = world_from_env({{"RANK", "5"},
                                 {"WORLD_SIZE", "8"},
                                 {"LOCAL_RANK", "1"},
                                 {"LOCAL_WORLD_SIZE", "4"},
                                 {"GROUP_RANK", "1"},
                                 {"MASTER_ADDR", "10.0.0.1"},
                                 {"MASTER_PORT", "1234"},
                                 {"TORCHELASTIC_RUN_ID", "x"},
                                 {"TORCHELASTIC_RESTART_COUNT", "2"},
                                 {"TORCHELASTIC_MAX_RESTARTS", "3"},
                                 {"TORCHELASTIC_USE_AGENT_STORE", "True"}});
  EXPECT_EQ(w.launcher, "torchrun");
  EXPECT_EQ(w.rank, 5);
  EXPECT_EQ(w.world_size, 8);
  EXPECT_EQ(w.local_rank, 1);
  EXPECT_EQ(w.local_world_size, 4);
  EXPECT_EQ(w.node_rank, 1);
  EXPECT_EQ(w.nnodes, 2);
  EXPECT_EQ(w.master_addr, "10.0.0.1");
  EXPECT_EQ(w.master_port, 1234);
  EXPECT_EQ(w.restart_count, 2);
  EXPECT_EQ(w.max_restarts, 3);
  EXPECT_EQ(w.run_id, "x");
  EXPECT_TRUE(w.agent_store);
}

// A torchrun restart finds the last attempt's run dir through the rendezvous id; torchrun's default id
// "none" is every such job's, so nothing is derived from it.
TEST(WorldInfo, TorchrunRunDirDerivesFromTheRendezvousId) {
  auto under = [](const std::string& id) {
    return cohort::train::launcher_run_dir(world_from_env(
        {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"TORCHELASTIC_RUN_ID", id}, {"TORCHELASTIC_RESTART_COUNT", "1"}}));
  };
  EXPECT_EQ(under("4f1c-aa"), "runs/torchrun-4f1c-aa");
  EXPECT_EQ(under("job 7/../x"), "runs/torchrun-job_7_.._x");
  EXPECT_EQ(under("none"), "");
  EXPECT_EQ(cohort::train::launcher_run_dir(world_from_env({{"RANK", "0"}, {"WORLD_SIZE", "2"}})), "");
}

TEST(WorldInfo, Slurm) {
  const auto w = world_from_env({{"SLURM_PROCID", "3"},
                                 {"SLURM_NTASKS", "4"},
                                 {"SLURM_LOCALID", "1"},
                                 {"SLURM_NTASKS_PER_NODE", "2(x2)"},
                                 {"SLURM_NODEID", "1"},
                                 {"SLURM_NNODES", "2"},
                                 {"SLURM_JOB_NODELIST", "gpu[07-08]"},
                                 {"SLURM_JOB_ID", "4242"},
                                 {"SLURM_RESTART_COUNT", "1"}});
  EXPECT_EQ(w.launcher, "slurm");
  EXPECT_EQ(w.rank, 3);
  EXPECT_EQ(w.local_world_size, 2);
  EXPECT_EQ(w.master_addr, "gpu07");
  EXPECT_EQ(w.master_port, 20000 + 4242);
  // A requeued job: the same id, one restart; its run dir is found again by the id.
  EXPECT_EQ(w.restart_count, 1);
  EXPECT_EQ(w.run_id, "4242");
  EXPECT_EQ(cohort::train::launcher_run_dir(w), "runs/slurm-4242");
}

TEST(WorldInfo, SlurmNodeLists) {
  EXPECT_EQ(cohort::comm::first_slurm_host("node01"), "node01");
  EXPECT_EQ(cohort::comm::first_slurm_host("node[03-05,9],gpu1"), "node03");
  EXPECT_EQ(cohort::comm::first_slurm_host("a,b"), "a");
  EXPECT_EQ(cohort::comm::first_slurm_host("rack1-n[12,14]"), "rack1-n12");
}

TEST(WorldInfo, OpenMpi) {
  const auto w = world_from_env({{"OMPI_COMM_WORLD_RANK", "1"},
                                 {"OMPI_COMM_WORLD_SIZE", "2"},
                                 {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                 {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
  EXPECT_EQ(w.launcher, "mpi");
  EXPECT_EQ(w.rank, 1);
  EXPECT_EQ(w.master_addr, "127.0.0.1");
  EXPECT_THROW(world_from_env({{"OMPI_COMM_WORLD_RANK", "1"},
                               {"OMPI_COMM_WORLD_SIZE", "4"},
                               {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                               {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}}),
               cohort::LaunchError);
}

TEST(WorldInfo, InconsistentEnvironmentIsAnError) {
  EXPECT_THROW(world_from_env({{"RANK", "2"}, {"WORLD_SIZE", "2"}}), cohort::LaunchError);
  EXPECT_THROW(world_from_env({{"RANK", "x"}, {"WORLD_SIZE", "2"}}), cohort::LaunchError);
  EXPECT_THROW(world_from_env({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}}), cohort::LaunchError);
}

// launch::set_nnodes: --nnodes as torchrun takes it, N or MIN:MAX, and a clear error for anything else.
#include <gtest/gtest.h>

#include "cohort/launch/Launcher.h"
#include "cohort/util/Error.h"

using cohort::launch::LaunchOptions;
using cohort::launch::set_nnodes;

TEST(SetNnodes, AFixedNumberOrAnElasticRange) {
  LaunchOptions o;
  set_nnodes("2", o);
  EXPECT_EQ(o.nnodes, 2);
  EXPECT_EQ(o.min_nodes, 0);
  set_nnodes("2:3", o);
  EXPECT_EQ(o.min_nodes, 2);
  EXPECT_EQ(o.nnodes, 3);
  set_nnodes("1:1", o);
  EXPECT_EQ(o.min_nodes, 1);
  EXPECT_EQ(o.nnodes, 1);
}

TEST(SetNnodes, AnythingElseIsRefusedNamingTheSpec) {
  for (const char* bad : {"0", "-1", "x", "2x", "", "3:2", "0:2", "2:", ":3", "a:b", "2:3:4"}) {
    LaunchOptions o;
    try {
      set_nnodes(bad, o);
      ADD_FAILURE() << "--nnodes " << bad << " was taken";
    } catch (const cohort::LaunchError& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("--nnodes ") + bad + " is not"), std::string::npos) << e.what();
    }
  }
}

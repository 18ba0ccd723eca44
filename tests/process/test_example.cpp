// The example program a LibTorch user copies from runs under torchrun-style environment variables.
#include <gtest/gtest.h>

#include "process/Harness.h"

using namespace cohort::testing;

TEST(Example, DdpExampleTrainsUnderTwoRanks) {
  const std::string exe =
      std::string(COHORT_BINARY).substr(0, std::string(COHORT_BINARY).rfind('/')) + "/examples/ddp_example";
  std::vector<std::unique_ptr<Proc>> ps;
  for (int r = 0; r < 2; ++r)
    ps.push_back(std::make_unique<Proc>(
        std::vector<std::string>{exe},
        std::map<std::string, std::string>{
            {"RANK", std::to_string(r)}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29761"}}));
  const auto r0 = ps[0]->wait(120), r1 = ps[1]->wait(120);
  ASSERT_EQ(r0.exit_code, 0) << r0.output;
  ASSERT_EQ(r1.exit_code, 0) << r1.output;
  // The loss falls from ~0.69 (chance on two classes).
  const auto last = r0.output.rfind("epoch 2 loss ");
  ASSERT_NE(last, std::string::npos) << r0.output;
  EXPECT_LT(std::stod(r0.output.substr(last + 13)), 0.5) << r0.output;
}

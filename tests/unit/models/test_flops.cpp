// The FLOP counter's formulas on operators whose counts are known by hand (tests/reference/flops.py checks
// whole models against torch.utils.flop_counter).
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "cohort/models/Flops.h"

TEST(FlopCounter, ALinearLayerCostsTwoFlopsAMultiplyAddForwardAndBothGradients) {
  torch::manual_seed(0);
  torch::nn::Linear fc(8, 4);
  const auto x = torch::randn({3, 8}, torch::requires_grad());
  cohort::models::FlopCounter count;
  ASSERT_TRUE(count.counting());
  const auto loss = fc->forward(x).sum();
  EXPECT_EQ(count.total(), 2.0 * 3 * 8 * 4) << "forward: one addmm";
  loss.backward();
  EXPECT_EQ(count.total(), 3 * (2.0 * 3 * 8 * 4)) << "backward: the input's and the weight's gradients";
}

TEST(FlopCounter, AConvolutionCountsItsOutputTimesItsKernelAndEachGradientOnce) {
  torch::manual_seed(0);
  torch::nn::Conv2d conv(torch::nn::Conv2dOptions(4, 6, 3).stride(2).padding(1).groups(2).bias(false));
  const auto x = torch::randn({2, 4, 9, 9});  // no gradient for the input: only the weight's is computed
  cohort::models::FlopCounter count;
  const auto y = conv->forward(x);
  ASSERT_EQ(y.sizes(), (std::vector<int64_t>{2, 6, 5, 5}));
  const double forward = 2.0 * static_cast<double>(y.numel()) * (4 / 2) * 3 * 3;
  EXPECT_EQ(count.total(), forward);
  y.sum().backward();
  EXPECT_EQ(count.total(), 2 * forward);
  EXPECT_EQ(count.by_op().at("aten::convolution_backward"), forward);
}

TEST(FlopCounter, BatchedProductsCountEveryMatrixAndASecondCounterDoesNotCount) {
  const auto a = torch::randn({5, 2, 3, 7}), b = torch::randn({5, 2, 7, 4});
  cohort::models::FlopCounter count;
  cohort::models::FlopCounter second;
  EXPECT_FALSE(second.counting());
  EXPECT_EQ(second.total(), -1);
  torch::matmul(a, b);
  EXPECT_EQ(count.total(), 2.0 * 5 * 2 * 3 * 7 * 4);
}

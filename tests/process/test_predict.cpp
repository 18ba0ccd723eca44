// `cohort predict` as a user runs it: a model trained by `cohort train`, then predictions on JPEG files
// (JSON lines, top-k with probabilities and the dataset's labels), on a safetensors tensor (logits that
// equal `cohort predict` on one rank and on two), and the named errors of bad input. The comparison with
// timm and torchvision is tests/reference/models.py.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include <torch/torch.h>

#include "cohort/checkpoint/Safetensors.h"
#include "process/Harness.h"
#include "support/JpegFiles.h"

namespace fs = std::filesystem;
using namespace cohort::testing;
namespace ck = cohort::checkpoint;

namespace {

const std::vector<std::string> kModel = {"model.name=resnet8", "model.width=4"};

// One short training run shared by the tests of this file.
const fs::path& trained_run() {
  static const fs::path dir = [] {
    const auto d = fresh_dir("predict-run");
    const auto r = cohort_train(quick_args(d, {"train.max_steps=10", "--nproc-per-node", "1"}));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return d;
  }();
  return dir;
}

std::vector<std::string> predict_args(std::vector<std::string> extra) {
  std::vector<std::string> a{"predict", "--checkpoint", trained_run().string()};
  a.insert(a.end(), kModel.begin(), kModel.end());
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

}  // namespace

TEST(Predict, JpegFilesGiveTopKJsonLinesWithLabels) {
  const auto dir = fresh_dir("predict-jpegs");
  write_jpeg(dir / "photos" / "a.jpg", 64, 48, 1);
  write_jpeg(dir / "photos" / "nested" / "b.JPEG", 40, 60, 2);
  const auto r =
      run_cohort(predict_args({(dir / "photos").string(), "--top-k", "3", "--out", (dir / "p.jsonl").string()}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto lines = read_jsonl(dir / "p.jsonl");
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0]["file"], (dir / "photos" / "a.jpg").string());  // sorted, recursive
  for (const auto& l : lines) {
    ASSERT_EQ(l["top"].size(), 3u);
    double sum = 0, last = 1;
    for (const auto& e : l["top"]) {
      EXPECT_LE(e["probability"].get<double>(), last);  // best first
      last = e["probability"];
      sum += last;
      EXPECT_TRUE(e.contains("label"));  // Fashion-MNIST's class names
    }
    EXPECT_GT(sum, 0.0);
    EXPECT_LE(sum, 1.0 + 1e-6);
  }
}

TEST(Predict, TensorInputGivesTheSameLogitsOnOneAndTwoRanks) {
  const auto dir = fresh_dir("predict-tensor");
  const auto x = torch::randn({5, 1, 28, 28}, torch::TensorOptions().dtype(torch::kFloat32));
  ck::save_safetensors(dir / "x.safetensors", {{"images", x}});
  std::vector<at::Tensor> logits;
  for (const char* ranks : {"1", "2"}) {
    const auto out = dir / (std::string("logits") + ranks + ".safetensors");
    const auto r = run_cohort(
        predict_args({"--input", (dir / "x.safetensors").string(), "--out", out.string(), "--nproc-per-node", ranks}));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    logits.push_back(ck::load_safetensors(out).tensors.at(0).second);
  }
  ASSERT_EQ(logits[0].sizes(), (std::vector<int64_t>{5, 10}));
  EXPECT_TRUE(torch::allclose(logits[0], logits[1], 1e-5, 1e-6));  // rank 1's block lands in order
}

TEST(Predict, BadInputIsANamedError) {
  const auto dir = fresh_dir("predict-bad");
  fs::create_directories(dir);
  std::ofstream(dir / "broken.jpg") << "not a jpeg";
  ck::save_safetensors(dir / "wrong_shape.safetensors", {{"images", torch::zeros({2, 3, 32, 32})}});
  const struct {
    std::vector<std::string> args;
    std::string names;
  } cases[] = {
      {predict_args({(dir / "broken.jpg").string()}), "broken.jpg"},
      {predict_args({(dir / "missing.jpg").string()}), "missing.jpg"},
      {predict_args({"--input", (dir / "wrong_shape.safetensors").string()}), "[N, 1, 28, 28]"},
      {{"predict", "--checkpoint", trained_run().string(), "model.name=resnet20", (dir / "broken.jpg").string()},
       "layer"},  // weights of another model: the mismatched tensors are named
      {predict_args({}), "needs image files"},
  };
  for (const auto& c : cases) {
    const auto r = run_cohort(c.args);
    EXPECT_NE(r.exit_code, 0) << c.names;
    EXPECT_NE(r.output.find(c.names), std::string::npos) << c.names << " not in: " << r.output;
    EXPECT_EQ(r.output.find("terminate called"), std::string::npos) << r.output;
  }
}

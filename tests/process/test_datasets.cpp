// The real datasets end to end with the `cohort` binary: an ImageNet-style JPEG folder (with a corrupt
// file) trained on by 2 workers, `cohort eval` of its best checkpoint across ranks, fine-tuning from a
// checkpoint with another class count, and the airbench network on CIFAR-10 files written by the test.
#include <gtest/gtest.h>

#include <fstream>

#include "process/Harness.h"
#include "support/JpegFiles.h"

namespace fs = std::filesystem;
using namespace cohort::testing;
using nlohmann::json;

namespace {

// train/ and val/ with 3 classes of small JPEGs, and one corrupt .jpg in train/.
fs::path make_image_folder(const std::string& name) {
  const auto root = fresh_dir(name);
  const char* classes[] = {"n01", "n02", "n03"};
  for (int c = 0; c < 3; ++c)
    for (int i = 0; i < 24; ++i) {
      // Each class has its own colour cast, so a few steps learn something.
      const std::string split = i < 16 ? "train" : "val";
      auto rgb = pattern(48, 40, i);
      for (size_t p = static_cast<size_t>(c); p < rgb.size(); p += 3) rgb[p] = static_cast<uint8_t>(rgb[p] / 2 + 120);
      const auto bytes = encode_jpeg(rgb, 48, 40);
      write_file(root / split / classes[c] / (std::to_string(i) + ".JPEG"), std::string(bytes.begin(), bytes.end()));
    }
  write_file(root / "train" / "n02" / "broken.JPEG", "\xff\xd8\xff\xe0 not really a jpeg");
  return root;
}

std::vector<std::string> folder_args(const fs::path& run_dir, const fs::path& data,
                                     std::vector<std::string> extra = {}) {
  std::vector<std::string> a = {
      "--run-dir",          run_dir.string(),     "data.name=imagefolder", "data.root=" + data.string(),
      "data.image_size=32", "model.name=resnet8", "model.width=8",         "model.num_classes=3",
      "data.batch_size=8",  "eval.batch_size=8",  "data.workers=1",        "train.epochs=2",
      "log.every_steps=2",  "dist.timeout_s=60"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

}  // namespace

TEST(Datasets, ImageFolderTrainsSkipsTheCorruptFileAndEvalAgrees) {
  const auto data = make_image_folder("imagefolder-data");
  const auto dir = fresh_dir("imagefolder-run");
  auto r = cohort_train(folder_args(dir, data));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("broken.JPEG"), std::string::npos) << r.output;  // named in the log
  const json s = read_json(dir / "summary.json");
  EXPECT_EQ(s["world_size"], 2);
  EXPECT_EQ(s["steps"], 2 * (49 / 2 / 8));  // 49 files over 2 ranks, 8 per batch, 2 epochs
  // Counted: the one corrupt file, on whichever rank(s) met it in the two epochs.
  EXPECT_GE(s["bad_files_skipped"].get<int64_t>(), 1);
  EXPECT_LE(s["bad_files_skipped"].get<int64_t>(), 2);
  // `cohort eval` of the last checkpoint on 2 ranks gives the run's final accuracy.
  r = run_cohort({"eval", "--checkpoint", (dir / "checkpoints" / "last.safetensors").string(), "--nproc-per-node", "2",
                  "--out", (dir / "eval.json").string(), "data.name=imagefolder", "data.root=" + data.string(),
                  "data.image_size=32", "model.name=resnet8", "model.width=8", "model.num_classes=3",
                  "eval.batch_size=8", "data.workers=1"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json e = read_json(dir / "eval.json");
  EXPECT_EQ(e["images"], 24);
  EXPECT_DOUBLE_EQ(e["top1"].get<double>(), s["test_accuracy"].get<double>());
  // data.on_bad_file=fail stops at the corrupt file, naming it.
  r = cohort_train(folder_args(fresh_dir("imagefolder-fail"), data, {"data.on_bad_file=fail"}));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("broken.JPEG"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("data.on_bad_file=skip"), std::string::npos) << r.output;
}

TEST(Datasets, FineTuningFromACheckpointWithAnotherClassCount) {
  const auto data = make_image_folder("finetune-data");
  const auto base = fresh_dir("finetune-base");
  // A "pretrained" model with 5 classes (as ImageNet's 1000 to CIFAR's 10).
  auto r = cohort_train(folder_args(base, data, {"model.num_classes=5", "train.max_steps=2"}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto tuned = fresh_dir("finetune-tuned");
  r = cohort_train(folder_args(
      tuned, data, {"model.pretrained=" + (base / "checkpoints" / "last.safetensors").string(), "train.max_steps=2"}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("new classifier head: fc.weight, fc.bias"), std::string::npos) << r.output;
  // Weights of another architecture: the error lists what does not fit.
  r = cohort_train(folder_args(fresh_dir("finetune-bad"), data,
                               {"model.pretrained=" + (base / "checkpoints" / "last.safetensors").string(),
                                "model.width=16", "train.max_steps=2"}));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("mismatched: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("conv1.weight (file [8, 3, 3, 3], model [16, 3, 3, 3])"), std::string::npos) << r.output;
}

TEST(Datasets, AirbenchOnCifarFilesWithLookaheadTtaAndAlternatingFlips) {
  const auto root = fresh_dir("cifar-data");
  auto records = [](int n, int salt) {
    std::string out;
    for (int r = 0; r < n; ++r) {
      const int label = (r * 7 + salt) % 10;
      out += static_cast<char>(label);
      for (int p = 0; p < 3072; ++p) out += static_cast<char>((p * 13 + r * 31 + label * 20) % 256);
    }
    return out;
  };
  for (int i = 1; i <= 5; ++i) write_file(root / ("data_batch_" + std::to_string(i) + ".bin"), records(64, i));
  write_file(root / "test_batch.bin", records(100, 0));
  const auto dir = fresh_dir("airbench-run");
  auto r =
      cohort_train({"--run-dir", dir.string(), "--config",
                    std::string(COHORT_SOURCE_DIR) + "/configs/cifar10_airbench.toml", "data.root=" + root.string(),
                    "data.batch_size=32", "train.epochs=2", "eval.batch_size=50", "dist.timeout_s=60"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json s = read_json(dir / "summary.json");
  EXPECT_EQ(s["model"], "airbench");
  EXPECT_EQ(s["config"]["eval.tta"], 2);
  EXPECT_EQ(s["config"]["data.flip"], "alternating");
  EXPECT_TRUE(s["config"]["train.lookahead"].get<bool>());
  EXPECT_GE(s["test_accuracy"].get<double>(), 0.0);
  // The lookahead average is part of the training state, so a resume continues it.
  bool has_lookahead = false;
  std::ifstream in(dir / "checkpoints" / "last.state.safetensors", std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  has_lookahead = bytes.find("lookahead.whiten.weight") != std::string::npos;
  EXPECT_TRUE(has_lookahead);
}

// data.device_resident keeps Fashion-MNIST on the training device (the CPU here) and builds batches with
// tensor ops there: two workers train the very same losses and test accuracy as the host path.
TEST(Datasets, DeviceResidentDataTrainsTheSameNumbersAsTheHostPath) {
  const auto host_dir = fresh_dir("resident-host"), dev_dir = fresh_dir("resident-dev");
  const std::vector<std::string> common = {"--nproc-per-node", "2", "data.crop_padding=2", "train.max_steps=6"};
  auto host = cohort_train(quick_args(host_dir, common));
  ASSERT_EQ(host.exit_code, 0) << host.output;
  auto extra = common;
  extra.push_back("data.device_resident=true");
  auto dev = cohort_train(quick_args(dev_dir, extra));
  ASSERT_EQ(dev.exit_code, 0) << dev.output;
  EXPECT_NE(dev.output.find("data fashion-mnist (on cpu)"), std::string::npos) << dev.output;
  EXPECT_EQ(host.output.find("(on cpu)"), std::string::npos) << host.output;
  const auto want = losses_by_step(host_dir), got = losses_by_step(dev_dir);
  ASSERT_EQ(got.size(), 6u);
  for (const auto& [step, loss] : want) EXPECT_EQ(got.at(step), loss) << "step " << step;
  EXPECT_EQ(read_json(dev_dir / "summary.json")["test_accuracy"],
            read_json(host_dir / "summary.json")["test_accuracy"]);
}

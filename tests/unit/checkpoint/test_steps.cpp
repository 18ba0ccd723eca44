// Step directories for checkpoints/last: the newest committed, intact save is the one loaded; a save
// without its marker, with a missing file or with damaged bytes is named and skipped; retention keeps
// keep_last saves; the links in checkpoints/ follow the newest.
#include "cohort/checkpoint/Steps.h"

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <fstream>

#include "cohort/util/Error.h"

namespace fs = std::filesystem;
namespace ck = cohort::checkpoint;

namespace {

fs::path fresh(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("cohort-steps-" + name + "-" + std::to_string(getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

// Saves a tiny model whose weights are `value`, as the trainer saves checkpoints/last.
fs::path save_step(const fs::path& ck_dir, int64_t step, float value, int keep_last = 10) {
  torch::nn::Linear model(3, 2);
  torch::NoGradGuard g;
  for (auto& p : model->parameters()) p.fill_(value);
  const fs::path dir = ck::new_step_dir(ck_dir, step);
  ck::save(dir, "last", *model, {{"momentum", torch::full({2}, value)}}, ck::TrainState{step, 0, -1, 1, "{}"});
  ck::commit_step(ck_dir, dir, step, keep_last);
  return dir;
}

float weight_of(const ck::Checkpoint& c) {
  for (const auto& [name, t] : c.model)
    if (name == "weight") return t.flatten()[0].item<float>();
  return -1;
}

TEST(CheckpointSteps, NamesAreNumberedAndASecondSaveOfAStepGetsASerial) {
  const auto d = fresh("names");
  EXPECT_EQ(ck::new_step_dir(d, 120).filename(), "step-00000120");
  save_step(d, 120, 1);
  EXPECT_EQ(ck::new_step_dir(d, 120).filename(), "step-00000120.1");
  save_step(d, 120, 2);
  save_step(d, 7, 3);
  const auto dirs = ck::list_step_dirs(d);
  ASSERT_EQ(dirs.size(), 3u);
  EXPECT_EQ(dirs[0].path.filename(), "step-00000120.1");
  EXPECT_EQ(dirs[1].path.filename(), "step-00000120");
  EXPECT_EQ(dirs[2].path.filename(), "step-00000007");
  // Newest is by step, then serial: step 7 was saved last but is not the newest.
  EXPECT_EQ(weight_of(ck::load_latest(d).checkpoint), 2.0f);
}

TEST(CheckpointSteps, TheNewestCommittedSaveIsLoadedAndLinked) {
  const auto d = fresh("newest");
  save_step(d, 10, 1);
  save_step(d, 20, 2);
  const auto found = ck::load_latest(d);
  EXPECT_EQ(found.checkpoint.state.step, 20);
  EXPECT_EQ(found.dir.filename(), "step-00000020");
  EXPECT_TRUE(found.skipped.empty());
  ASSERT_TRUE(fs::is_symlink(d / "last.safetensors"));
  EXPECT_EQ(fs::read_symlink(d / "last.safetensors"), fs::path("step-00000020") / "last.safetensors");
  EXPECT_TRUE(ck::has_resumable(d));
}

TEST(CheckpointSteps, ACutOffSaveIsNamedAndTheOneBeforeIsUsed) {
  const auto d = fresh("cutoff");
  save_step(d, 10, 1);
  // A save killed before its marker: files there, no COMMIT.
  torch::nn::Linear model(3, 2);
  const fs::path dir = ck::new_step_dir(d, 20);
  ck::save(dir, "last", *model, {}, ck::TrainState{20, 0, -1, 1, "{}"});
  const auto found = ck::load_latest(d);
  EXPECT_EQ(found.checkpoint.state.step, 10);
  ASSERT_EQ(found.skipped.size(), 1u);
  EXPECT_NE(found.skipped[0].find("step-00000020: no COMMIT marker"), std::string::npos) << found.skipped[0];
}

TEST(CheckpointSteps, DamagedOrMissingFilesAreNamedAndSkipped) {
  const auto d = fresh("damaged");
  save_step(d, 10, 1);
  const auto s20 = save_step(d, 20, 2);
  const auto s30 = save_step(d, 30, 3);
  // step 30: one byte of tensor data flipped (same size, so only the checksum can tell).
  {
    std::fstream f(s30 / "last.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-1, std::ios::end);
    char c = 0;
    f.get(c);
    f.seekp(-1, std::ios::end);
    f.put(static_cast<char>(c ^ 0x40));
  }
  // step 20: the training state is gone.
  fs::remove(s20 / "last.state.safetensors");
  const auto found = ck::load_latest(d);
  EXPECT_EQ(found.checkpoint.state.step, 10);
  EXPECT_EQ(weight_of(found.checkpoint), 1.0f);
  ASSERT_EQ(found.skipped.size(), 2u);
  EXPECT_NE(found.skipped[0].find("step-00000030"), std::string::npos);
  EXPECT_NE(found.skipped[0].find("CRC-32C"), std::string::npos) << found.skipped[0];
  EXPECT_NE(found.skipped[1].find("step-00000020: file last.state.safetensors listed in COMMIT is missing"),
            std::string::npos)
      << found.skipped[1];
}

TEST(CheckpointSteps, NothingUsableIsAnErrorListingEveryCandidate) {
  const auto d = fresh("none");
  EXPECT_FALSE(ck::has_resumable(d));
  const auto s = save_step(d, 5, 1);
  fs::remove(s / ck::names::kStepCommit);
  try {
    ck::load_latest(d);
    FAIL() << "no error";
  } catch (const cohort::CheckpointError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("no complete checkpoint"), std::string::npos) << m;
    EXPECT_NE(m.find("step-00000005: no COMMIT marker"), std::string::npos) << m;
  }
}

TEST(CheckpointSteps, RetentionKeepsTheNewestKeepLastAndDropsCutOffSaves) {
  const auto d = fresh("retention");
  save_step(d, 1, 1, 2);
  // A cut-off save between two good ones.
  torch::nn::Linear model(3, 2);
  ck::save(ck::new_step_dir(d, 2), "last", *model, {}, ck::TrainState{2, 0, -1, 1, "{}"});
  save_step(d, 3, 3, 2);
  save_step(d, 4, 4, 2);
  std::vector<std::string> names;
  for (const auto& s : ck::list_step_dirs(d)) names.push_back(s.path.filename().string());
  EXPECT_EQ(names, (std::vector<std::string>{"step-00000004", "step-00000003"}));
  save_step(d, 5, 5, 1);
  names.clear();
  for (const auto& s : ck::list_step_dirs(d)) names.push_back(s.path.filename().string());
  EXPECT_EQ(names, (std::vector<std::string>{"step-00000005"}));
  EXPECT_EQ(weight_of(ck::load_latest(d).checkpoint), 5.0f);
}

}  // namespace

// Run directories written by an earlier cohort (tests/fixtures/run-dirs: ddp and zero2, 2 ranks, each with
// a committed "last" at step 10 and a "best") must keep working after the checkpoint format changes: the
// run resumes with the losses the old build logged when it resumed the same directory, and `cohort eval`
// of the run directory (its best checkpoint) reports the old build's test figures. expected.json in each
// fixture records what the old build did and the command lines it used.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include <torch/version.h>

#include "process/Harness.h"

namespace fs = std::filesystem;
using namespace cohort::testing;

namespace {

// Whether this process runs Debian's reference BLAS (libblas3), which LibTorch 1.13 wrote the fixture
// with; with OpenBLAS in its place (scripts/install-deps since 2026-11-28) the classifier's matrix
// product rounds differently in the last bits (2.10288 either way, not the same double).
bool reference_blas() {
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);)
    if (line.find("/blas/libblas.so") != std::string::npos) return true;
  return false;
}

// The LibTorch and BLAS that replayed the fixture with the old build and logged the same losses bit for
// bit (1.13.1 on the reference BLAS wrote it, pip's 2.14.1 with its MKL resumed it); another LibTorch
// or BLAS may round a kernel differently.
bool replayed_exactly() {
  return (TORCH_VERSION_MAJOR == 1 && TORCH_VERSION_MINOR == 13 && reference_blas()) ||
         (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR == 14);
}

fs::path copy_fixture(const std::string& name) {
  const auto dir = fresh_dir("old-run-" + name);
  fs::copy(fs::path(COHORT_SOURCE_DIR) / "tests" / "fixtures" / "run-dirs" / name, dir,
           fs::copy_options::recursive | fs::copy_options::copy_symlinks | fs::copy_options::overwrite_existing);
  return dir;
}

void expect_resumes_as_before(const std::string& name) {
  const auto dir = copy_fixture(name);
  const auto expected = read_json(dir / "expected.json");
  auto r = cohort_train({"--nproc-per-node", "2", "--resume", dir.string(), "train.max_steps=14"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resuming at step 10"), std::string::npos) << r.output;
  const auto losses = losses_by_step(dir);
  for (const auto& [step, loss] : expected.at("losses_after_resume").items()) {
    const auto it = losses.find(std::stoll(step));
    ASSERT_NE(it, losses.end()) << "no loss logged for step " << step;
    if (replayed_exactly()) {
      EXPECT_EQ(it->second, loss.get<double>()) << name << " step " << step;
    } else {
      EXPECT_NEAR(it->second, loss.get<double>(), 1e-3) << name << " step " << step;
    }
  }
}

void expect_best_evaluates_as_before(const std::string& name) {
  const auto dir = copy_fixture(name);
  const auto expected = read_json(dir / "expected.json").at("best");
  const auto out = dir / "eval.json";
  auto r = run_cohort({"eval", "--checkpoint", dir.string(), "--out", out.string(), "model.name=resnet8",
                       "model.width=4", "data.test_limit=200", "amp.precision=fp32", "train.channels_last=false"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto got = read_json(out);
  EXPECT_EQ(got.at("top1").get<double>(), expected.at("top1").get<double>()) << r.output;
  EXPECT_NEAR(got.at("loss").get<double>(), expected.at("loss").get<double>(), 1e-4) << r.output;
}

}  // namespace

TEST(OldRunDirs, DdpResumesWithTheSameLosses) { expect_resumes_as_before("ddp"); }
TEST(OldRunDirs, Zero2ResumesWithTheSameLosses) { expect_resumes_as_before("zero2"); }
TEST(OldRunDirs, DdpBestEvaluatesAsBefore) { expect_best_evaluates_as_before("ddp"); }
TEST(OldRunDirs, Zero2BestEvaluatesAsBefore) { expect_best_evaluates_as_before("zero2"); }

// Compression still trains, in a check short enough for every `make test`: the default job's model and
// data (2 workers, ResNet-8, Fashion-MNIST) at batch 2 x 16 for kSteps steps, PowerSGD rank 2 from step
// kStart, against the same run uncompressed on the same seed. Batch 32, not the job's 128: each run
// takes 46 s, not 170, on a 2-core CPU without AVX-512 (2026-11-28), and the bound below still holds. 100
// steps, not 150: 6.1 and 6.7 s here in auto's bf16 (8.8 and 9.1 at 150), 8.8 and 9.9 in fp32 as on a CPU
// without bf16 (15.1 and 13.9), on an AVX512-BF16 EPYC (2026-12-03), the bounds held as below. Batch 16,
// not 32: 17.5 and 17.8 s a run, not about 32, on an AVX2-only EPYC (2026-12-05), where this check was
// the longest of make test and ran alone (Note [Process tests two at a time] in tests/CMakeLists.txt). The loss over
// the last kTail steps must stay near the uncompressed one, and every compressed step must have sent a small fraction
// of the gradient bytes. The full comparison (two 3-epoch runs and their test accuracy, 8 to 10 minutes on 2 cores) is
// a benchmark: bench/compress_accuracy.py, bench/results/compress_accuracy.json.
#include <gtest/gtest.h>

#include <numeric>

#include "process/Harness.h"

using namespace cohort::testing;

namespace {

constexpr int kSteps = 100, kStart = 20, kTail = 25;

double tail_loss(const std::filesystem::path& run_dir) {
  const auto l = step_losses(run_dir, kSteps - kTail);
  return l.empty() ? 0.0 : std::accumulate(l.begin(), l.end(), 0.0) / static_cast<double>(l.size());
}

}  // namespace

TEST(CompressAccuracy, PowerSgdRankTwoTracksTheUncompressedLossAtAFractionOfTheBytes) {
  // lr 0.2 and 3 epochs (the schedule's span): what the figures below were measured at (the default job's
  // recipe moved to lr 0.8 on 2026-11-28, and to 2.7 epochs at lr 1.2 on 2026-12-01).
  const std::vector<std::string> common{"ckpt.save_best=false",
                                        "eval.enabled=false",
                                        "log.every_steps=1",
                                        "log.progress=plain",
                                        "train.max_steps=" + std::to_string(kSteps),
                                        "optim.lr=0.2",
                                        "train.epochs=3",
                                        "data.batch_size=16"};
  const auto plain = fresh_dir("accuracy-none");
  auto args = common;
  args.insert(args.begin(), {"--run-dir", plain.string()});
  auto r = cohort_train(args, 600);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto compressed = fresh_dir("accuracy-powersgd");
  args = common;
  args.insert(args.begin(), {"--run-dir", compressed.string(), "dist.compress=powersgd", "powersgd.rank=2",
                             "powersgd.start_iter=" + std::to_string(kStart)});
  r = cohort_train(args, 600);
  ASSERT_EQ(r.exit_code, 0) << r.output;

  const double loss_plain = tail_loss(plain), loss_compressed = tail_loss(compressed);
  ASSERT_GT(loss_plain, 0.0);
  ASSERT_GT(loss_compressed, 0.0);
  // Measured at 150 steps from step 30, batch 2 x 128 (bf16, the default job's auto choice), from 1.73 at
  // step 31: LibTorch 1.13 0.950 uncompressed, 0.980 compressed (3% higher); pip's 2.14.1 0.938 and 0.991
  // (6% higher). At batch 2 x 32 (fp32 on an AVX2-only CPU, LibTorch 1.13), from 1.84 at step 31: 1.203
  // and 1.231 (2.4% higher), 32x fewer bytes. At these 100 steps from step 20 (LibTorch 1.13), from 2.03 at
  // step 21: 1.355 and 1.380 in bf16 (1.8% higher), 1.354 and 1.379 in fp32. At batch 2 x 16 (fp32, an
  // AVX2-only EPYC, LibTorch 1.13), from 2.07 at step 21: 1.444 and 1.466 (1.5% higher), 32x fewer bytes;
  // not measured in bf16 at this batch, where batch 32 gave the same 1.8% as fp32. 15% is the bound: gradients
  // that compression got wrong leave the loss far higher (no update at all stays near 1.7), while correct
  // runs differ by a few percent with the LibTorch's kernels and the rank-2 approximation.
  EXPECT_LE(loss_compressed, loss_plain * 1.15) << "uncompressed " << loss_plain << ", PowerSGD " << loss_compressed;
  EXPECT_LT(loss_compressed, step_losses(compressed, kStart).front() * 0.8) << "the compressed run stopped learning";

  const auto a = read_json(plain / "summary.json"), b = read_json(compressed / "summary.json");
  EXPECT_EQ(b["compress"], "powersgd");
  EXPECT_GT(b["compression_ratio"].get<double>(), 20.0);
  EXPECT_EQ(a["compression_ratio"].get<double>(), 1.0);
}

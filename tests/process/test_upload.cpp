// ckpt.upload end to end: a real 2-worker `cohort train` uploads checkpoints/best to a moto_server that checks
// signatures, and the objects read back are byte-identical to the local files. A wrong secret leaves the run
// successful and its checkpoint in place (Note [A failed upload keeps the run]). Skipped, with the reason,
// when moto_server or the aws CLI is not installed.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <iterator>

#include "cohort/checkpoint/Safetensors.h"
#include "process/Harness.h"
#include "support/MotoServer.h"

namespace fs = std::filesystem;
using namespace cohort::testing;

namespace {

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

size_t count(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + part.size())) ++n;
  return n;
}

const char* const kCheckpointFiles[] = {"best.safetensors", "best.state.safetensors"};

class Upload : public MotoSuite {
 protected:
  // Credentials the way a user exports them. An empty AWS_SESSION_TOKEN keeps a token from the environment the
  // tests run in out of the signed requests.
  static std::map<std::string, std::string> aws_env(const std::string& secret_key) {
    return {{"AWS_ACCESS_KEY_ID", moto_->access_key()},
            {"AWS_SECRET_ACCESS_KEY", secret_key},
            {"AWS_SESSION_TOKEN", ""},
            {"AWS_REGION", "us-east-1"}};
  }

  // A short 2-worker run (8 steps an epoch) that uploads to s3://<bucket>/<prefix>/<run dir name>/.
  static ProcResult train_and_upload(const fs::path& dir, const std::string& prefix, std::vector<std::string> extra,
                                     const std::string& secret_key) {
    std::vector<std::string> args{"--nproc-per-node", "2", "data.train_limit=512",
                                  "ckpt.upload=s3://" + moto_->bucket() + "/" + prefix};
    args.insert(args.end(), extra.begin(), extra.end());
    return cohort_train(quick_args(dir, args), 120, aws_env(secret_key));
  }

  // Each checkpoint file read back from moto is byte-identical to the local one.
  static void expect_uploaded_copies(const fs::path& dir, const std::string& prefix) {
    for (const std::string file : kCheckpointFiles) {
      const std::string key = prefix + "/" + dir.filename().string() + "/" + file;
      const auto got = moto_->get_object(key);
      ASSERT_TRUE(got.ok) << got.error;
      const std::string local = read_file(dir / "checkpoints" / file);
      ASSERT_GT(local.size(), 0u) << file;
      // Not EXPECT_EQ: a mismatch would print hundreds of KB of binary.
      EXPECT_TRUE(got.out == local) << key << ": " << got.out.size() << " bytes uploaded, " << local.size()
                                    << " bytes local";
    }
  }
};

TEST_F(Upload, BestCheckpointArrivesByteIdentical) {
  const auto dir = fresh_dir("upload-ok");
  const auto r =
      train_and_upload(dir, "runs", {"train.epochs=1", "--s3-endpoint", moto_->endpoint()}, moto_->secret_key());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto up = read_json(dir / "summary.json").at("upload");
  EXPECT_EQ(up.at("ok"), true) << up.dump();
  EXPECT_EQ(up.at("checkpoint"), "best") << up.dump();
  EXPECT_EQ(up.at("url"), "s3://" + moto_->bucket() + "/runs/" + dir.filename().string() + "/") << up.dump();
  EXPECT_FALSE(up.contains("error")) << up.dump();
  const auto ckpts = dir / "checkpoints";
  EXPECT_EQ(up.at("bytes").get<uint64_t>(),
            fs::file_size(ckpts / "best.safetensors") + fs::file_size(ckpts / "best.state.safetensors"));
  EXPECT_TRUE(has(r.output, "cohort: uploaded checkpoints/best (")) << r.output;
  expect_uploaded_copies(dir, "runs");
}

TEST_F(Upload, WrongSecretWarnsAndKeepsRunAndCheckpoint) {
  const auto dir = fresh_dir("upload-denied");
  const auto r =
      train_and_upload(dir, "denied", {"train.epochs=1", "ckpt.s3_endpoint=" + moto_->endpoint()}, "not-the-secret");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto up = read_json(dir / "summary.json").at("upload");
  EXPECT_EQ(up.at("ok"), false) << up.dump();
  const std::string error = up.value("error", "");
  EXPECT_TRUE(has(error, "403") && has(error, "SignatureDoesNotMatch")) << up.dump();

  const auto best = dir / "checkpoints" / "best.safetensors";
  EXPECT_TRUE(has(r.output, "cohort: warning: the upload of checkpoints/best failed: ")) << r.output;
  EXPECT_TRUE(has(r.output, "the checkpoint is kept at " + best.string())) << r.output;
  ASSERT_TRUE(fs::exists(best));
  EXPECT_GT(fs::file_size(best), 0u);
  EXPECT_NO_THROW(cohort::checkpoint::load_safetensors(best));
  // Nothing half-written arrived either.
  EXPECT_FALSE(moto_->get_object("denied/" + dir.filename().string() + "/best.safetensors").ok);
}

TEST_F(Upload, EveryTimeUploadsEachImprovementAndEndsWithTheFinalBest) {
  const auto dir = fresh_dir("upload-every");
  const auto r = train_and_upload(
      dir, "every", {"train.epochs=2", "ckpt.upload_best_every_time=true", "--s3-endpoint", moto_->endpoint()},
      moto_->secret_key());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(read_json(dir / "summary.json").at("upload").at("ok"), true);
  // One upload per improvement of the best test accuracy (the first evaluation always improves on "none"),
  // then the final one after training.
  size_t improvements = 0;
  double best = -1;
  for (const auto& line : read_jsonl(dir / "metrics.jsonl")) {
    if (line["kind"] != "eval") continue;
    const double top1 = line["test_top1"].get<double>();
    if (top1 > best) ++improvements;
    best = std::max(best, top1);
  }
  EXPECT_GE(improvements, 1u);
  EXPECT_EQ(count(r.output, "cohort: uploaded checkpoints/best ("), improvements + 1) << r.output;
  expect_uploaded_copies(dir, "every");
}

}  // namespace

// A sharded save (fsdp) uploads every file of the tag: both ranks' shards, the manifest and the commit
// marker, so the bucket holds a checkpoint `cohort export` can reassemble.
TEST_F(Upload, ShardedBestUploadsEveryShardManifestAndCommitMarker) {
  const auto dir = fresh_dir("upload-sharded");
  const auto r =
      train_and_upload(dir, "sharded", {"train.epochs=1", "dist.strategy=fsdp", "--s3-endpoint", moto_->endpoint()},
                       moto_->secret_key());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto up = read_json(dir / "summary.json").at("upload");
  EXPECT_EQ(up.at("ok"), true) << up.dump();
  uint64_t local_bytes = 0;
  for (const std::string file : {"best.shard-00000-of-00002.safetensors", "best.shard-00001-of-00002.safetensors",
                                 "best.manifest.json", "best.commit"}) {
    const auto got = moto_->get_object("sharded/" + dir.filename().string() + "/" + file);
    ASSERT_TRUE(got.ok) << file << ": " << got.error;
    const std::string local = read_file(dir / "checkpoints" / file);
    EXPECT_TRUE(got.out == local) << file;
    local_bytes += local.size();
  }
  EXPECT_EQ(up.at("bytes").get<uint64_t>(), local_bytes);
}

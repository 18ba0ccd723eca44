#include "cohort/upload/CheckpointUpload.h"

#include <algorithm>
#include <chrono>
#include <iostream>

#include "cohort/checkpoint/Names.h"
#include "cohort/upload/S3.h"
#include "cohort/util/Error.h"

namespace cohort::upload {
namespace fs = std::filesystem;
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

}  // namespace

// Note [A failed upload keeps the run]
// Uploading the best checkpoint happens after it is safely on local disk, and only reads it. A failure
// (credentials, network, the store) is printed with its cause and recorded in summary.json, and the run
// still ends normally: the checkpoint it trained for stays where it was, and the upload can be retried
// with the `aws` CLI from the printed path.
nlohmann::json upload_checkpoint(const TrainConfig& cfg, const fs::path& run_dir) {
  const fs::path ckpts = run_dir / checkpoint::names::kCheckpointsDir;
  const std::string tag = fs::exists(ckpts / checkpoint::names::weights_file(checkpoint::names::kBest)) ||
                                  fs::exists(ckpts / checkpoint::names::manifest_file(checkpoint::names::kBest))
                              ? checkpoint::names::kBest
                              : checkpoint::names::kLast;
  nlohmann::json rec = {{"checkpoint", tag}, {"ok", false}};
  const auto t0 = Clock::now();
  try {
    const auto opt = upload::S3Options::from_env(cfg.ckpt.s3_endpoint);
    auto dest = upload::S3Url::parse(cfg.ckpt.upload);
    if (!dest.key.empty() && dest.key.back() != '/') dest.key += '/';
    dest.key += run_dir.filename().string() + "/";
    rec["url"] = dest.str();
    // Every file of the tag: the weights and state, or a sharded save's slices and manifest, with its
    // commit marker last so a reader of the bucket never sees a marker before the slices.
    std::vector<std::string> files;
    for (const auto& e : fs::directory_iterator(ckpts)) {
      const auto name = e.path().filename().string();
      if (name.rfind(tag + ".", 0) == 0 && name != checkpoint::names::commit_file(tag)) files.push_back(name);
    }
    std::sort(files.begin(), files.end());
    if (fs::exists(ckpts / checkpoint::names::commit_file(tag))) files.push_back(checkpoint::names::commit_file(tag));
    uint64_t bytes = 0;
    for (const auto& file : files) bytes += upload::upload_file(opt, dest, ckpts / file);
    rec["ok"] = true;
    rec["bytes"] = bytes;
    rec["seconds"] = seconds_since(t0);
    std::cout << "cohort: uploaded checkpoints/" << tag << " (" << bytes << " bytes) to " << dest.str() << std::endl;
  } catch (const Error& e) {
    rec["error"] = e.what();
    std::cerr << "cohort: warning: the upload of checkpoints/" << tag << " failed: " << e.describe()
              << "\ncohort: the checkpoint is kept at " << (ckpts / checkpoint::names::weights_file(tag)).string()
              << std::endl;
  }
  return rec;
}

}  // namespace cohort::upload

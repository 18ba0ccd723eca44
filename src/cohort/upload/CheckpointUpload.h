// After training, rank 0 uploads the run's best checkpoint (else the last) to S3-compatible storage.
//
//   nlohmann::json rec = cohort::upload::upload_checkpoint(cfg, run_dir);   // {"checkpoint", "ok", "url", "bytes"...}
#pragma once

#include <filesystem>

#include <nlohmann/json.hpp>

#include "cohort/config/Config.h"

namespace cohort::upload {

// Never throws for a failed upload: see Note [A failed upload keeps the run]. The record goes into
// summary.json.
nlohmann::json upload_checkpoint(const TrainConfig& cfg, const std::filesystem::path& run_dir);

}  // namespace cohort::upload

// Uploads: S3 with SigV4, and checkpoints sent there as they are saved.
// One header for the whole area, for programs that use cohort as a library; cohort's own code includes
// the headers it uses one by one.
//
//   #include "cohort/upload.h"
//   nlohmann::json rec = cohort::upload::upload_checkpoint(cfg, run_dir);
#pragma once

#include "cohort/upload/CheckpointUpload.h"
#include "cohort/upload/S3.h"
#include "cohort/upload/SigV4.h"

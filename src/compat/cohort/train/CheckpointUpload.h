// Moved to cohort/upload/CheckpointUpload.h, namespace cohort::upload; see
// Note [Headers that moved keep their old path for one release] in src/CMakeLists.txt.
// A program written against this path still builds; new code includes the new one.
#pragma once

#include "cohort/upload/CheckpointUpload.h"

namespace cohort::train {
using upload::upload_checkpoint;
}  // namespace cohort::train

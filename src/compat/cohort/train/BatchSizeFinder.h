// Moved to cohort/commands/BatchSizeFinder.h, namespace cohort::commands; see
// Note [Headers that moved keep their old path for one release] in src/CMakeLists.txt.
// A program written against this path still builds; new code includes the new one.
#pragma once

#include "cohort/commands/BatchSizeFinder.h"

namespace cohort::train {
using commands::available_memory_bytes;
using commands::find_batch_size;
using commands::FindOptions;
using commands::FindResult;
using commands::parse_bytes;
using commands::run_trial;
using commands::to_json;
using commands::Trial;
}  // namespace cohort::train

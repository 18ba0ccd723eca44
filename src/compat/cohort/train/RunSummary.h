// Moved to cohort/record/RunSummary.h, namespace cohort::record; see
// Note [Headers that moved keep their old path for one release] in src/CMakeLists.txt.
// A program written against this path still builds; new code includes the new one.
#pragma once

#include "cohort/record/RunSummary.h"

namespace cohort::train {
using record::RunFacts;
using record::write_run_summary;
}  // namespace cohort::train

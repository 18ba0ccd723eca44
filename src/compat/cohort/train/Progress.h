// Moved to cohort/record/Progress.h, namespace cohort::record; see
// Note [Headers that moved keep their old path for one release] in src/CMakeLists.txt.
// A program written against this path still builds; new code includes the new one.
#pragma once

#include "cohort/record/Progress.h"

namespace cohort::train {
using record::Progress;
using record::ProgressState;
}  // namespace cohort::train

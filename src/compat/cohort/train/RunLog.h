// Moved to cohort/record/RunLog.h, namespace cohort::record; see
// Note [Headers that moved keep their old path for one release] in src/CMakeLists.txt.
// A program written against this path still builds; new code includes the new one.
#pragma once

#include "cohort/record/RunLog.h"

namespace cohort::train {
using record::EvalWindow;
using record::percent;
using record::RunIdentity;
using record::RunLog;
using record::tracker_tags;
using record::TrainWindow;
}  // namespace cohort::train

// Moved to cohort/record/StepTrace.h, namespace cohort::record; see
// Note [Headers that moved keep their old path for one release] in src/CMakeLists.txt.
// A program written against this path still builds; new code includes the new one.
#pragma once

#include "cohort/record/StepTrace.h"

namespace cohort::train {
using record::kStepTraceFormat;
using record::kStepTraceVersion;
using record::merge_step_traces;
using record::StepTrace;
}  // namespace cohort::train

// Moved to cohort/record/PhaseClock.h, namespace cohort::record; see
// Note [Headers that moved keep their old path for one release] in src/CMakeLists.txt.
// A program written against this path still builds; new code includes the new one.
#pragma once

#include "cohort/record/PhaseClock.h"

namespace cohort::train {
using record::gather_time_breakdown;
using record::kPhaseCount;
using record::Phase;
using record::phase_name;
using record::phase_seconds;
using record::PhaseClock;
using record::phases_json;
}  // namespace cohort::train

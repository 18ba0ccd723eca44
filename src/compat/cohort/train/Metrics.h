// Moved to cohort/record/Metrics.h, namespace cohort::record; see
// Note [Headers that moved keep their old path for one release] in src/CMakeLists.txt.
// A program written against this path still builds; new code includes the new one.
#pragma once

#include "cohort/record/Metrics.h"

namespace cohort::train {
using record::JsonLines;
using record::MetricSums;
using record::MetricWindow;
}  // namespace cohort::train

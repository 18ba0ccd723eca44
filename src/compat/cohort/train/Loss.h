// Moved to cohort/models/Loss.h, namespace cohort::models; see
// Note [Headers that moved keep their old path for one release] in src/CMakeLists.txt.
// A program written against this path still builds; new code includes the new one.
#pragma once

#include "cohort/models/Loss.h"

namespace cohort::train {
using models::training_loss;
}  // namespace cohort::train

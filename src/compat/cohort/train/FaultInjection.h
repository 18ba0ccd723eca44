// Moved to cohort/comm/FaultInjection.h, namespace cohort::comm; see
// Note [Headers that moved keep their old path for one release] in src/CMakeLists.txt.
// A program written against this path still builds; new code includes the new one.
#pragma once

#include "cohort/comm/FaultInjection.h"

namespace cohort::train {
using comm::fault_steps_from_env;
using comm::FaultPlan;
using comm::poison_gradient;
}  // namespace cohort::train

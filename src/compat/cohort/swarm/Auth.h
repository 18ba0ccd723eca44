// Moved to cohort/p2p/Auth.h, namespace cohort::p2p; see
// Note [Headers that moved keep their old path for one release] in src/CMakeLists.txt.
// A program written against this path still builds; new code includes the new one.
#pragma once

#include "cohort/p2p/Auth.h"

namespace cohort::swarm {
using namespace cohort::p2p;
}  // namespace cohort::swarm

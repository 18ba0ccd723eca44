// Mixed precision: autocast, fp16 loss scaling, fp32 master weights and the precision a run resolves.
// One header for the whole area, for programs that use cohort as a library; cohort's own code includes
// the headers it uses one by one.
//
//   #include "cohort/amp.h"
//   cohort::amp::GradScaler scaler(cfg.amp, /*enabled=*/true);
#pragma once

#include "cohort/amp/Autocast.h"
#include "cohort/amp/GradScaler.h"
#include "cohort/amp/MasterWeights.h"
#include "cohort/amp/MixedPrecision.h"

// Optimizers, learning-rate schedules and the EMA of weights.
// One header for the whole area, for programs that use cohort as a library; cohort's own code includes
// the headers it uses one by one.
//
//   #include "cohort/optim.h"
//   auto opt = cohort::optim::make_optimizer(cfg.optim, groups);
#pragma once

#include "cohort/optim/Ema.h"
#include "cohort/optim/Optimizer.h"
#include "cohort/optim/Schedule.h"
#include "cohort/optim/Sgd.h"

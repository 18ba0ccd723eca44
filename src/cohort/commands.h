// The commands besides train: eval, predict and the batch-size finder.
// One header for the whole area, for programs that use cohort as a library; cohort's own code includes
// the headers it uses one by one.
//
//   #include "cohort/commands.h"
//   cohort::commands::run_predict_worker(cfg, cohort::comm::world_from_env(cohort::comm::current_env()), o);
#pragma once

#include "cohort/commands/BatchSizeFinder.h"
#include "cohort/commands/Eval.h"
#include "cohort/commands/Predict.h"

// Training: the loop, its setup and the strategy factory.
// One header for the whole area, for programs that use cohort as a library; cohort's own code includes
// the headers it uses one by one.
//
//   #include "cohort/train.h"
//   cohort::train::TrainResult r = cohort::train::run_worker(cfg,
//   cohort::comm::world_from_env(cohort::comm::current_env()));
#pragma once

#include "cohort/train/AutoSettings.h"
#include "cohort/train/Checkpointing.h"
#include "cohort/train/Device.h"
#include "cohort/train/Evaluate.h"
#include "cohort/train/InitialWeights.h"
#include "cohort/train/RankAgreement.h"
#include "cohort/train/Recipe.h"
#include "cohort/train/Setup.h"
#include "cohort/train/StepWatch.h"
#include "cohort/train/StrategyFactory.h"
#include "cohort/train/Trainer.h"
#include "cohort/train/TrainingRun.h"

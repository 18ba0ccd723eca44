// Checkpoints: the training state, safetensors files, sharded saves and the saved steps of a run directory.
// One header for the whole area, for programs that use cohort as a library; cohort's own code includes
// the headers it uses one by one.
//
//   #include "cohort/checkpoint.h"
//   auto ck = cohort::checkpoint::load(cohort::checkpoint::resolve_resume_dir("runs/x"), "last");
#pragma once

#include "cohort/checkpoint/Checkpoint.h"
#include "cohort/checkpoint/Names.h"
#include "cohort/checkpoint/Safetensors.h"
#include "cohort/checkpoint/ShardedCheckpoint.h"
#include "cohort/checkpoint/Steps.h"
#include "cohort/checkpoint/TrainingState.h"

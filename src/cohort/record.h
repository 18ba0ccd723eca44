// What a run leaves behind: the run log, summary.json, the phase clock, step traces, metrics, progress.
// One header for the whole area, for programs that use cohort as a library; cohort's own code includes
// the headers it uses one by one.
//
//   #include "cohort/record.h"
//   cohort::record::write_run_summary(facts, clock, monitor, log);   // collective: every rank calls it
#pragma once

#include "cohort/record/Metrics.h"
#include "cohort/record/PhaseClock.h"
#include "cohort/record/Progress.h"
#include "cohort/record/RunLog.h"
#include "cohort/record/RunSummary.h"
#include "cohort/record/StepTrace.h"

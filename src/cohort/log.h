// What a run reports to: TensorBoard, MLflow, the resource monitor, peak FLOP/s and the report.
// One header for the whole area, for programs that use cohort as a library; cohort's own code includes
// the headers it uses one by one.
//
//   #include "cohort/log.h"
//   cohort::log::EventWriter tb(run_dir);
#pragma once

#include "cohort/log/Mlflow.h"
#include "cohort/log/Nvml.h"
#include "cohort/log/Peak.h"
#include "cohort/log/Report.h"
#include "cohort/log/ResourceMonitor.h"
#include "cohort/log/Svg.h"
#include "cohort/log/TensorBoard.h"

// The configuration: TrainConfig and its sections, parsed from TOML and --key=value, validated.
// One header for the whole area, for programs that use cohort as a library; cohort's own code includes
// the headers it uses one by one.
//
//   #include "cohort/config.h"
//   auto cfg = cohort::config::load("configs/fmnist.toml", {"data.batch_size=64", "train.epochs=2"});
#pragma once

#include "cohort/config/Config.h"
#include "cohort/config/Fields.h"
#include "cohort/config/TomlGuard.h"

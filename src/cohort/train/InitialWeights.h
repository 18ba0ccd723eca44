// Where a run's first weights come from, in the trainer's order of precedence: a resumed checkpoint's,
// a pretrained file's (model.pretrained, with a new classifier head when the class count differs), or,
// for airbench, the whitening layer computed from the training images; otherwise the model's own
// initialization.
//
//   cohort::train::initial_weights(*model, cfg, *data.train, resuming ? &resume.model : nullptr, source, lead);
#pragma once

#include <string>

#include "cohort/checkpoint/Checkpoint.h"
#include "cohort/config/Config.h"
#include "cohort/data/Source.h"
#include "cohort/models/Models.h"

namespace cohort::train {

// `resumed`: the checkpoint's weights (nullptr when not resuming), named `source` in errors. Rank 0
// (`lead`) logs what a pretrained file replaced.
void initial_weights(models::Classifier& model, const TrainConfig& cfg, data::Source& train,
                     const checkpoint::NamedTensors* resumed, const std::string& source, bool lead);

}  // namespace cohort::train

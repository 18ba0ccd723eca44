// Moved to cohort/commands/Predict.h, namespace cohort::commands; see
// Note [Headers that moved keep their old path for one release] in src/CMakeLists.txt.
// A program written against this path still builds; new code includes the new one.
#pragma once

#include "cohort/commands/Predict.h"

namespace cohort::train {
using commands::class_names;
using commands::input_shape;
using commands::InputShape;
using commands::list_images;
using commands::PredictOptions;
using commands::preprocess_image;
using commands::run_predict_worker;
}  // namespace cohort::train

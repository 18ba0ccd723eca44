// Small helpers every area uses: atomic files, the cache directory, CRC-32C, errors, HTTP, seeds, stop signals,
// LibTorch versions.
// One header for the whole area, for programs that use cohort as a library; cohort's own code includes
// the headers it uses one by one.
//
//   #include "cohort/util.h"
//   cohort::util::AtomicFile file(dir / "model.safetensors");
#pragma once

#include "cohort/util/AtomicFile.h"
#include "cohort/util/CacheDir.h"
#include "cohort/util/Crc32c.h"
#include "cohort/util/Error.h"
#include "cohort/util/FileLimit.h"
#include "cohort/util/Http.h"
#include "cohort/util/Memory.h"
#include "cohort/util/OldNames.h"
#include "cohort/util/Rng.h"
#include "cohort/util/StopSignal.h"
#include "cohort/util/TorchCompat.h"

// Datasets and the input pipeline: Fashion-MNIST, CIFAR-10, image folders, JPEG decoding, the sampler.
// One header for the whole area, for programs that use cohort as a library; cohort's own code includes
// the headers it uses one by one.
//
//   #include "cohort/data.h"
//   cohort::data::DistributedSampler sampler(n, world_size, rank, /*shuffle=*/true, /*seed=*/0, false);
#pragma once

#include "cohort/data/Batch.h"
#include "cohort/data/Cifar10.h"
#include "cohort/data/Datasets.h"
#include "cohort/data/DeviceResident.h"
#include "cohort/data/DistributedSampler.h"
#include "cohort/data/FashionMnist.h"
#include "cohort/data/Idx.h"
#include "cohort/data/ImageFolder.h"
#include "cohort/data/ImageTransforms.h"
#include "cohort/data/Jpeg.h"
#include "cohort/data/Presets.h"
#include "cohort/data/Source.h"

// All of cohort for a LibTorch program: one header per area (cohort/comm.h, cohort/parallel.h...), as
// <torch/torch.h> is for LibTorch. examples/ddp_example.cpp includes it.
//
//   #include "cohort/cohort.h"
//   cohort::parallel::ddp::DistributedDataParallel ddp(net.ptr(), world.comm);
#pragma once

#include "cohort/amp.h"
#include "cohort/checkpoint.h"
#include "cohort/comm.h"
#include "cohort/commands.h"
#include "cohort/config.h"
#include "cohort/data.h"
#include "cohort/launch.h"
#include "cohort/log.h"
#include "cohort/models.h"
#include "cohort/optim.h"
#include "cohort/p2p.h"
#include "cohort/parallel.h"
#include "cohort/record.h"
#include "cohort/store.h"
#include "cohort/train.h"
#include "cohort/upload.h"
#include "cohort/util.h"

// Data parallelism behind one Strategy: ddp with gradient compression, ZeRO-1/2 and FSDP, the swarm and
// DiLoCo.
// One header for the whole area, for programs that use cohort as a library; cohort's own code includes
// the headers it uses one by one.
//
//   #include "cohort/parallel.h"
//   cohort::parallel::ddp::DistributedDataParallel ddp(model, world.comm);
#pragma once

#include "cohort/parallel/BucketPlan.h"
#include "cohort/parallel/GradReadyHook.h"
#include "cohort/parallel/Params.h"
#include "cohort/parallel/Strategy.h"
#include "cohort/parallel/compress/LowPrecisionHook.h"
#include "cohort/parallel/compress/PowerSgd.h"
#include "cohort/parallel/ddp/CommHook.h"
#include "cohort/parallel/ddp/DdpStrategy.h"
#include "cohort/parallel/ddp/DistributedDataParallel.h"
#include "cohort/parallel/ddp/Reducer.h"
#include "cohort/parallel/shard/FlatUnits.h"
#include "cohort/parallel/shard/OptimizerSlices.h"
#include "cohort/parallel/shard/ShardPlan.h"
#include "cohort/parallel/shard/ShardedStrategy.h"
#include "cohort/parallel/shard/UnitRunner.h"
#include "cohort/parallel/shard/Units.h"
#include "cohort/parallel/swarm/DilocoStrategy.h"
#include "cohort/parallel/swarm/PeerState.h"
#include "cohort/parallel/swarm/SwarmPeer.h"
#include "cohort/parallel/swarm/SwarmStrategy.h"

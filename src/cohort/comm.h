// Collectives and the job's world: the Communicator (Gloo, NCCL), the rendezvous, the flight recorder,
// peer watch and the doctor.
// One header for the whole area, for programs that use cohort as a library; cohort's own code includes
// the headers it uses one by one.
//
//   #include "cohort/comm.h"
//   auto world = cohort::comm::rendezvous(cohort::comm::world_from_env(cohort::comm::current_env()), "gloo",
//                                        std::chrono::seconds(60));
#pragma once

#include "cohort/comm/Communicator.h"
#include "cohort/comm/Doctor.h"
#include "cohort/comm/FaultInjection.h"
#include "cohort/comm/FlightRecorder.h"
#include "cohort/comm/GlooCommunicator.h"
#include "cohort/comm/NcclCommunicator.h"
#include "cohort/comm/PeerWatch.h"
#include "cohort/comm/PieceExchange.h"
#include "cohort/comm/Rendezvous.h"
#include "cohort/comm/WorldInfo.h"

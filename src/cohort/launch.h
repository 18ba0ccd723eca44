// Starting workers: the launcher, its elastic rendezvous and Slurm's requeue.
// One header for the whole area, for programs that use cohort as a library; cohort's own code includes
// the headers it uses one by one.
//
//   #include "cohort/launch.h"
//   cohort::launch::LaunchOptions o;
#pragma once

#include "cohort/launch/ElasticRendezvous.h"
#include "cohort/launch/Launcher.h"
#include "cohort/launch/SlurmRequeue.h"

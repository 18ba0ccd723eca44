// The swarm's networking: peer credentials, the transport, the directory of peers, averaging rounds and
// state transfer.
// One header for the whole area, for programs that use cohort as a library; cohort's own code includes
// the headers it uses one by one.
//
//   #include "cohort/p2p.h"
//   cohort::p2p::Transport transport(identity, run_public_key, "10.0.0.2:7000");
#pragma once

#include "cohort/p2p/Auth.h"
#include "cohort/p2p/Averager.h"
#include "cohort/p2p/Codec.h"
#include "cohort/p2p/Directory.h"
#include "cohort/p2p/PeerRecord.h"
#include "cohort/p2p/StateTransfer.h"
#include "cohort/p2p/Transport.h"
#include "cohort/p2p/Wire.h"

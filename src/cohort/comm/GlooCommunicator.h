// The Gloo backend of cohort::comm::Communicator, for CPU tensors, on top of c10d's ProcessGroupGloo.
//
//   auto comm = cohort::comm::GlooCommunicator::create(store, rank, world, "127.0.0.1", std::chrono::seconds(300));
//   comm->all_reduce(t, cohort::comm::ReduceOp::kSum, "grads")->wait();
//
// Built only when gloo's headers were found (COHORT_HAVE_GLOO); otherwise create() throws a CommError.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "cohort/comm/Communicator.h"
#include "cohort/util/OldNames.h"  // the names of the last release, for programs outside this tree

namespace cohort::comm {

class GlooCommunicator {
 public:
  // `local_address` is the address this rank's Gloo pairs bind to: the interface that reaches the
  // other ranks (loopback for single-machine jobs). `threads`: collectives Gloo runs at once. A program
  // that left SIGPIPE at its default gets a handler that does nothing (Note [A write to a dead rank must
  // not kill this one]): a write to a dead rank then fails rather than ending the process.
  static CommunicatorPtr create(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                const std::string& local_address, std::chrono::milliseconds timeout, int threads = 2);
};

}  // namespace cohort::comm

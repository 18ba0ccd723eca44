// The names of the last release, for programs written against it: Note [Names that moved keep their old
// name for one release] in src/CMakeLists.txt. Every header whose names moved includes this one; cohort's
// own code (COHORT_BUILDING) sees none of it. Delete it in the next release.
//
//   cohort::DistributedDataParallel ddp(net, world.comm);   // as cohort::parallel::ddp::DistributedDataParallel
#pragma once

#ifndef COHORT_BUILDING
// A using-directive names a namespace, not the names it holds yet: the declarations a header adds after
// this one are found through it too.
namespace cohort::comm {}
namespace cohort::parallel::ddp {}
namespace cohort::parallel::compress {}
namespace cohort::parallel::shard {}
namespace cohort::parallel::swarm {}
namespace cohort {
using namespace comm;
using namespace parallel;
using namespace parallel::ddp;
using namespace parallel::compress;
using namespace parallel::shard;  // ShardedStrategy and its options were cohort::
using namespace parallel::swarm;  // make_swarm_strategy and make_diloco_strategy were cohort::
namespace shard {
using namespace cohort::parallel::shard;
}
namespace swarm {
using namespace cohort::parallel::swarm;
}
}  // namespace cohort
#endif

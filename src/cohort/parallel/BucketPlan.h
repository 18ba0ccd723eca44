// Which gradient goes into which bucket: a pure function of parameter sizes, dtypes and the bucket caps,
// so every rank computes the same plan without talking (c10d's compute_bucket_assignment_by_size does the
// same job). The one bucketer: ddp's all-reduce buckets and ZeRO's flat units both come from it.
//
//   auto plan = cohort::parallel::plan_buckets({{"w", {1000}, at::kFloat}, {"b", {10}, at::kFloat}}, 25 << 20,
//                                              1 << 20);
//   // plan[0].params == {1, 0}: the last parameters come first.
#pragma once

#include <cstdint>
#include <vector>

#include <c10/core/ScalarType.h>

#include "cohort/parallel/Params.h"
#include "cohort/util/OldNames.h"  // the names of the last release, for programs outside this tree

namespace cohort::parallel {

struct BucketSpec {
  c10::ScalarType dtype;
  std::vector<size_t> params;    // indices into the parameter list, in the order they were added
  std::vector<int64_t> offsets;  // element offset of each parameter inside the flat bucket
  int64_t numel = 0;
};

// Note [Buckets launch in the same order on every rank]
// Parameters are visited in reverse registration order, because backward produces the gradients of the
// last layers first; a bucket closes once it holds at least its cap in bytes. The first bucket of each
// dtype uses the smaller `first_cap_bytes` so the first all-reduce starts early in backward. The
// returned order is the launch order: the reducer launches bucket i only after buckets 0..i-1, on every
// rank, so collectives pair up across ranks even when gradients arrive in a different order.
//
// With `last_cap_bytes` > 0 the last bucket of each dtype is small too: the first parameters in
// registration order, up to that cap, whose gradients come last. The optimizer inside backward steps each
// bucket while the later ones are still being reduced, so the last bucket's step is the one nothing
// hides (Note [The optimizer inside backward] in parallel/ddp/DdpStrategy.cpp).
std::vector<BucketSpec> plan_buckets(const std::vector<ParamSpec>& params, int64_t cap_bytes, int64_t first_cap_bytes,
                                     int64_t last_cap_bytes = 0);

}  // namespace cohort::parallel

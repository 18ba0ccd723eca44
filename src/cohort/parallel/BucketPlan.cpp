#include "cohort/parallel/BucketPlan.h"

#include <map>

namespace cohort::parallel {

namespace {

// The indices of the parameters that form the small last bucket of each dtype: the first in registration
// order, until the dtype's tail holds at least `last_cap_bytes`. Empty when the cap is 0.
std::vector<bool> tail_of(const std::vector<ParamSpec>& params, int64_t last_cap_bytes) {
  std::vector<bool> tail(params.size(), false);
  if (last_cap_bytes <= 0) return tail;
  std::map<c10::ScalarType, int64_t> bytes;
  for (size_t k = 0; k < params.size(); ++k) {
    auto& b = bytes[params[k].dtype];
    if (b >= last_cap_bytes) continue;
    tail[k] = true;
    b += params[k].numel() * static_cast<int64_t>(c10::elementSize(params[k].dtype));
  }
  return tail;
}

void add(BucketSpec& b, size_t k, const ParamSpec& p) {
  b.params.push_back(k);
  b.offsets.push_back(b.numel);
  b.numel += p.numel();
}

}  // namespace

std::vector<BucketSpec> plan_buckets(const std::vector<ParamSpec>& params, int64_t cap_bytes, int64_t first_cap_bytes,
                                     int64_t last_cap_bytes) {
  // Buckets are listed in the order they were opened; a bucket is one flat tensor, so each dtype has
  // its own open bucket.
  const auto tail = tail_of(params, last_cap_bytes);
  std::vector<BucketSpec> buckets;
  std::map<c10::ScalarType, size_t> open;
  std::map<c10::ScalarType, int> closed_count;
  for (size_t k = params.size(); k-- > 0;) {
    const auto& p = params[k];
    if (tail[k]) continue;
    auto it = open.find(p.dtype);
    if (it == open.end()) {
      it = open.emplace(p.dtype, buckets.size()).first;
      buckets.push_back(BucketSpec{p.dtype, {}, {}, 0});
    }
    BucketSpec& b = buckets[it->second];
    add(b, k, p);
    const int64_t bytes = b.numel * static_cast<int64_t>(c10::elementSize(p.dtype));
    const int64_t cap = closed_count[p.dtype] == 0 ? first_cap_bytes : cap_bytes;
    if (bytes >= cap) {
      ++closed_count[p.dtype];
      open.erase(it);
    }
  }
  // The tails come last, their parameters in the order their gradients arrive.
  std::map<c10::ScalarType, size_t> tails;
  for (size_t k = params.size(); k-- > 0;) {
    if (!tail[k]) continue;
    auto it = tails.find(params[k].dtype);
    if (it == tails.end()) {
      it = tails.emplace(params[k].dtype, buckets.size()).first;
      buckets.push_back(BucketSpec{params[k].dtype, {}, {}, 0});
    }
    add(buckets[it->second], k, params[k]);
  }
  return buckets;
}

}  // namespace cohort::parallel

#include "cohort/parallel/BucketPlan.h"

#include <map>

namespace cohort {

std::vector<BucketSpec> plan_buckets(const std::vector<ParamSpec>& params, int64_t cap_bytes, int64_t first_cap_bytes) {
  // Buckets are listed in the order they were opened; a bucket is one flat tensor, so each dtype has
  // its own open bucket.
  std::vector<BucketSpec> buckets;
  std::map<c10::ScalarType, size_t> open;
  std::map<c10::ScalarType, int> closed_count;
  for (size_t k = params.size(); k-- > 0;) {
    const auto& p = params[k];
    auto it = open.find(p.dtype);
    if (it == open.end()) {
      it = open.emplace(p.dtype, buckets.size()).first;
      buckets.push_back(BucketSpec{p.dtype, {}, {}, 0});
    }
    BucketSpec& b = buckets[it->second];
    b.params.push_back(k);
    b.offsets.push_back(b.numel);
    b.numel += p.numel();
    const int64_t bytes = b.numel * static_cast<int64_t>(c10::elementSize(p.dtype));
    const int64_t cap = closed_count[p.dtype] == 0 ? first_cap_bytes : cap_bytes;
    if (bytes >= cap) {
      ++closed_count[p.dtype];
      open.erase(it);
    }
  }
  return buckets;
}

}  // namespace cohort

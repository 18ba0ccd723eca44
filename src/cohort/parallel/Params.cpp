#include "cohort/parallel/Params.h"

#include <algorithm>
#include <functional>
#include <map>
#include <sstream>

#include "cohort/util/Error.h"

namespace cohort::parallel {
namespace {

constexpr int64_t kMaxDims = 6;
constexpr int64_t kRow = 3 + kMaxDims;  // name hash, dtype, ndim, dims...

std::string shape_text(const int64_t* row) {
  std::ostringstream os;
  os << "[";
  for (int64_t d = 0; d < row[2]; ++d) os << (d ? "," : "") << row[3 + d];
  os << "]";
  return os.str();
}

std::string differs(const int64_t* mine, const int64_t* theirs, int64_t k, const std::string& name) {
  if (mine[0] != theirs[0])
    return "parameter #" + std::to_string(k) + " is named differently than rank 0's '" + name + "'";
  if (mine[1] != theirs[1])
    return "parameter '" + name + "' has dtype " + c10::toString(static_cast<c10::ScalarType>(theirs[1])) +
           ", rank 0's has " + c10::toString(static_cast<c10::ScalarType>(mine[1]));
  return "parameter '" + name + "' has shape " + shape_text(theirs) + ", rank 0's has " + shape_text(mine);
}

void check_counts_match(int64_t n, comm::Communicator& comm, const std::string& who) {
  const int world = comm.size();
  auto count = at::full({1}, n, at::kLong);
  auto counts = at::zeros({world}, at::kLong);
  comm.all_gather(counts, count, who + " parameter count check")->wait();
  for (int r = 0; r < world; ++r)
    if (counts[r].item<int64_t>() != counts[0].item<int64_t>())
      throw CommError("rank " + std::to_string(comm.rank()) + ": " + who + ": model replicas differ: rank " +
                          std::to_string(r) + " has " + std::to_string(counts[r].item<int64_t>()) +
                          " parameters, rank 0 has " + std::to_string(counts[0].item<int64_t>()),
                      "every rank must build the same model with the same config");
}

}  // namespace

int64_t ParamSpec::numel() const {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

std::vector<ParamSpec> Trainable::specs() const {
  std::vector<ParamSpec> out;
  for (size_t i = 0; i < params.size(); ++i)
    out.push_back({names[i], params[i].sizes().vec(), params[i].scalar_type()});
  return out;
}

Trainable trainable_parameters(torch::nn::Module& module, const std::string& who) {
  Trainable out;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    if (!item.value().requires_grad()) continue;
    out.names.push_back(item.key());
    out.params.push_back(item.value());
  }
  if (out.params.empty())
    throw Error(who + ": the model has no parameters that require grad",
                "wrap the model itself, not a parameter-free container");
  return out;
}

// One row per parameter (name hash, dtype, shape), all-gathered, so that each rank can name the first
// rank and parameter that differ from rank 0 instead of hanging or corrupting memory in a mismatched
// collective later.
void check_replicas_match(const Trainable& trainable, comm::Communicator& comm, const std::string& who) {
  const int world = comm.size();
  if (world == 1) return;
  const auto n = static_cast<int64_t>(trainable.params.size());
  check_counts_match(n, comm, who);
  auto rows = at::zeros({n, kRow}, at::kLong);
  for (int64_t i = 0; i < n; ++i) {
    const auto& p = trainable.params[i];
    auto* row = rows[i].data_ptr<int64_t>();
    row[0] = static_cast<int64_t>(std::hash<std::string>{}(trainable.names[i]) & 0x7fffffffffffffffull);
    row[1] = static_cast<int64_t>(p.scalar_type());
    row[2] = std::min<int64_t>(p.dim(), kMaxDims);
    for (int64_t d = 0; d < row[2]; ++d) row[3 + d] = p.size(d);
  }
  auto all = at::zeros({world * n, kRow}, at::kLong);
  comm.all_gather(all, rows, who + " parameter shape check")->wait();
  const auto* base = all.data_ptr<int64_t>();
  for (int r = 1; r < world; ++r)
    for (int64_t k = 0; k < n; ++k) {
      const int64_t* mine = base + k * kRow;
      const int64_t* theirs = base + (r * n + k) * kRow;
      if (std::equal(mine, mine + kRow, theirs)) continue;
      throw CommError("rank " + std::to_string(comm.rank()) + ": " + who + ": model replicas differ: on rank " +
                          std::to_string(r) + ", " + differs(mine, theirs, k, trainable.names[k]),
                      "every rank must build the same model with the same config");
    }
}

void FlatBroadcast::launch(const std::vector<at::Tensor>& tensors, comm::Communicator& comm, const std::string& what) {
  finish();
  if (comm.size() == 1 || tensors.empty()) return;
  std::map<c10::ScalarType, std::vector<at::Tensor>> by_dtype;
  for (const auto& t : tensors) by_dtype[t.scalar_type()].push_back(t);
  for (auto& [dtype, group] : by_dtype) {
    std::vector<at::Tensor> flat_parts;
    for (const auto& t : group) flat_parts.push_back(t.detach().reshape(-1));
    Group g{group, at::cat(flat_parts), nullptr};
    g.handle = comm.broadcast(g.flat, 0, what);
    groups_.push_back(std::move(g));
  }
}

void FlatBroadcast::finish() {
  at::NoGradGuard no_grad;
  for (auto& g : groups_) {
    g.handle->wait();
    int64_t offset = 0;
    for (auto& t : g.targets) {
      t.detach().copy_(g.flat.narrow(0, offset, t.numel()).view(t.sizes()));
      offset += t.numel();
    }
  }
  groups_.clear();
}

void broadcast_from_rank0(const std::vector<at::Tensor>& tensors, comm::Communicator& comm, const std::string& what) {
  FlatBroadcast b;
  b.launch(tensors, comm, what);
  b.finish();
}

}  // namespace cohort::parallel

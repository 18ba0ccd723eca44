#include "cohort/parallel/ddp/DistributedDataParallel.h"

#include <functional>
#include <map>
#include <sstream>

#include "cohort/util/Error.h"

namespace cohort {
namespace {

constexpr int64_t kMaxDims = 6;
constexpr int64_t kRow = 2 + kMaxDims;  // name hash, ndim, dims...

std::string shape_text(const int64_t* row) {
  std::ostringstream os;
  os << "[";
  for (int64_t d = 0; d < row[1]; ++d) os << (d ? "," : "") << row[2 + d];
  os << "]";
  return os.str();
}

}  // namespace

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<torch::nn::Module> module, CommunicatorPtr comm,
                                                 DdpOptions options)
    : module_(std::move(module)), comm_(std::move(comm)), options_(options) {
  std::vector<at::Tensor> params;
  for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
    if (!item.value().requires_grad()) continue;
    names_.push_back(item.key());
    params.push_back(item.value());
  }
  if (params.empty())
    throw Error("DistributedDataParallel: the module has no parameters that require grad",
                "wrap the model itself, not a parameter-free container");
  check_replicas_match();
  broadcast_state();
  ReducerOptions ro;
  ro.bucket_cap_bytes = static_cast<int64_t>(options_.bucket_mb * (1 << 20));
  ro.first_bucket_cap_bytes = static_cast<int64_t>(options_.first_bucket_mb * (1 << 20));
  ro.overlap = options_.overlap;
  ro.find_unused_parameters = options_.find_unused_parameters;
  reducer_ = std::make_unique<Reducer>(std::move(params), names_, comm_, ro);
  if (options_.broadcast_buffers) {
    // The forward that updated the batch-norm statistics is over once backward begins, so their
    // broadcast is launched then and overlaps the whole backward; it is waited for at the end.
    reducer_->set_before_sync([this] { launch_buffer_broadcast(); });
    reducer_->set_after_sync([this] { finish_broadcast(pending_buffers_); });
  }
}

// Every rank contributes one row per parameter (name hash, shape); all-gathering the rows lets each
// rank name the first rank and parameter that differ from rank 0, instead of hanging or corrupting
// memory in a mismatched all-reduce later.
void DistributedDataParallel::check_replicas_match() {
  if (comm_->size() == 1) return;
  const int world = comm_->size();
  auto count = at::full({1}, static_cast<int64_t>(names_.size()), at::kLong);
  auto counts = at::zeros({world}, at::kLong);
  comm_->all_gather(counts, count, "DDP parameter count check")->wait();
  for (int r = 0; r < world; ++r) {
    if (counts[r].item<int64_t>() != counts[0].item<int64_t>())
      throw CommError("rank " + std::to_string(comm_->rank()) + ": model replicas differ: rank " + std::to_string(r) +
                          " has " + std::to_string(counts[r].item<int64_t>()) + " parameters, rank 0 has " +
                          std::to_string(counts[0].item<int64_t>()),
                      "every rank must build the same model with the same config");
  }
  const auto n = static_cast<int64_t>(names_.size());
  auto rows = at::zeros({n, kRow}, at::kLong);
  auto params = module_->named_parameters(true);
  int64_t i = 0;
  for (const auto& item : params) {
    if (!item.value().requires_grad()) continue;
    auto* row = rows[i].data_ptr<int64_t>();
    row[0] = static_cast<int64_t>(std::hash<std::string>{}(item.key()) & 0x7fffffffffffffffull);
    row[1] = std::min<int64_t>(item.value().dim(), kMaxDims);
    for (int64_t d = 0; d < row[1]; ++d) row[2 + d] = item.value().size(d);
    ++i;
  }
  auto all = at::zeros({world * n, kRow}, at::kLong);
  comm_->all_gather(all, rows, "DDP parameter shape check")->wait();
  const auto* base = all.data_ptr<int64_t>();
  for (int r = 1; r < world; ++r) {
    for (int64_t k = 0; k < n; ++k) {
      const int64_t* mine = base + k * kRow;
      const int64_t* theirs = base + (r * n + k) * kRow;
      if (std::equal(mine, mine + kRow, theirs)) continue;
      std::string what = mine[0] != theirs[0]
                             ? "parameter #" + std::to_string(k) + " is named differently than rank 0's '" + names_[k] + "'"
                             : "parameter '" + names_[k] + "' has shape " + shape_text(theirs) + ", rank 0's has " +
                                   shape_text(mine);
      throw CommError("rank " + std::to_string(comm_->rank()) + ": model replicas differ: on rank " + std::to_string(r) +
                          ", " + what,
                      "every rank must build the same model with the same config");
    }
  }
}

std::vector<DistributedDataParallel::FlatBroadcast> DistributedDataParallel::launch_broadcast(
    const std::vector<at::Tensor>& tensors, const std::string& what) {
  std::vector<FlatBroadcast> out;
  if (comm_->size() == 1 || tensors.empty()) return out;
  // One broadcast per dtype instead of one per tensor: a ResNet has dozens of small buffers.
  std::map<c10::ScalarType, std::vector<at::Tensor>> by_dtype;
  for (const auto& t : tensors) by_dtype[t.scalar_type()].push_back(t);
  for (auto& [dtype, group] : by_dtype) {
    std::vector<at::Tensor> flat_parts;
    for (const auto& t : group) flat_parts.push_back(t.detach().reshape(-1));
    FlatBroadcast fb{group, at::cat(flat_parts), nullptr};
    fb.handle = comm_->broadcast(fb.flat, 0, what);
    out.push_back(std::move(fb));
  }
  return out;
}

void DistributedDataParallel::finish_broadcast(std::vector<FlatBroadcast>& pending) {
  at::NoGradGuard no_grad;
  for (auto& fb : pending) {
    fb.handle->wait();
    int64_t offset = 0;
    for (auto& t : fb.targets) {
      t.detach().copy_(fb.flat.narrow(0, offset, t.numel()).view(t.sizes()));
      offset += t.numel();
    }
  }
  pending.clear();
}

void DistributedDataParallel::broadcast_state() {
  std::vector<at::Tensor> all;
  for (const auto& p : module_->parameters(true)) all.push_back(p);
  for (const auto& b : module_->buffers(true)) all.push_back(b);
  auto pending = launch_broadcast(all, "DDP initial parameters and buffers from rank 0");
  finish_broadcast(pending);
}

void DistributedDataParallel::broadcast_buffers() {
  launch_buffer_broadcast();
  finish_broadcast(pending_buffers_);
}

void DistributedDataParallel::launch_buffer_broadcast() {
  const auto buffers = module_->buffers(true);
  pending_buffers_ = launch_broadcast(std::vector<at::Tensor>(buffers.begin(), buffers.end()), "DDP buffers from rank 0");
}

}  // namespace cohort

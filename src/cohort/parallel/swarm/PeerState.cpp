#include "cohort/parallel/swarm/PeerState.h"

#include <sodium.h>

#include <cstring>

#include "cohort/util/Error.h"

namespace cohort::parallel::swarm {

namespace {
constexpr const char* kModel = "model.";
constexpr const char* kOptimizer = "optim.";
constexpr const char* kExtra = "extra.";

bool take_prefix(const std::string& name, const char* prefix, std::string& rest) {
  const size_t n = std::strlen(prefix);
  if (name.compare(0, n, prefix) != 0) return false;
  rest = name.substr(n);
  return true;
}
}  // namespace

std::string pack_peer_state(const torch::nn::Module& model, const optim::NamedState& optimizer,
                            const checkpoint::NamedTensors& extra) {
  checkpoint::NamedTensors tensors;
  for (const auto& item : model.named_parameters()) tensors.emplace_back(kModel + item.key(), item.value().detach());
  for (const auto& item : model.named_buffers()) tensors.emplace_back(kModel + item.key(), item.value().detach());
  for (const auto& [name, t] : optimizer) tensors.emplace_back(kOptimizer + name, t);
  for (const auto& [name, t] : extra) tensors.emplace_back(kExtra + name, t);
  return checkpoint::to_safetensors_bytes(tensors, {{"format", "cohort-swarm-state"}});
}

uint64_t weights_digest(const torch::nn::Module& model) {
  COHORT_ASSERT(sodium_init() >= 0, "libsodium could not be initialized");
  crypto_generichash_state state;
  crypto_generichash_init(&state, nullptr, 0, sizeof(uint64_t));
  const auto add = [&](const at::Tensor& t) {
    const auto bytes = t.detach().to(at::kCPU).contiguous();
    crypto_generichash_update(&state, static_cast<const unsigned char*>(bytes.data_ptr()), bytes.nbytes());
  };
  for (const auto& item : model.named_parameters()) add(item.value());
  uint64_t out = 0;
  crypto_generichash_final(&state, reinterpret_cast<unsigned char*>(&out), sizeof(out));
  return out;
}

PeerState unpack_peer_state(const std::string& bytes) {
  const auto file = checkpoint::from_safetensors_bytes(bytes, "the swarm's state");
  PeerState state;
  std::string rest;
  for (const auto& [name, t] : file.tensors) {
    if (take_prefix(name, kModel, rest)) state.model[rest] = t;
    if (take_prefix(name, kOptimizer, rest)) state.optimizer.emplace_back(rest, t);
    if (take_prefix(name, kExtra, rest)) state.extra.emplace_back(rest, t);
  }
  return state;
}

void load_model_state(torch::nn::Module& model, const PeerState& state) {
  at::NoGradGuard no_grad;
  const auto copy = [&](const std::string& name, at::Tensor target) {
    const auto it = state.model.find(name);
    if (it == state.model.end() || it->second.sizes() != target.sizes())
      throw ConfigError("swarm: the downloaded state has no tensor " + name + " of " + std::to_string(target.numel()) +
                            " elements: the donor trains another model",
                        "give every peer the same model.* config");
    target.copy_(it->second);
  };
  for (const auto& item : model.named_parameters()) copy(item.key(), item.value().detach());
  for (const auto& item : model.named_buffers()) copy(item.key(), item.value());
}

void share_with_local_workers(comm::Communicator& comm, std::string& bytes, int64_t& step) {
  if (comm.size() == 1) return;
  auto head = at::tensor({step, static_cast<int64_t>(bytes.size())}, at::kLong);
  comm.broadcast(head, 0, "swarm: caught-up state size")->wait();
  step = head[0].item<int64_t>();
  auto body = at::empty({head[1].item<int64_t>()}, at::kByte);
  if (comm.rank() == 0) std::memcpy(body.data_ptr(), bytes.data(), bytes.size());
  comm.broadcast(body, 0, "swarm: caught-up state")->wait();
  bytes.assign(static_cast<const char*>(body.data_ptr()), static_cast<size_t>(body.numel()));
}

}  // namespace cohort::parallel::swarm

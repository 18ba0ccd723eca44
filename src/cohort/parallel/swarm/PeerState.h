// The state a swarm peer hands a newcomer, or a peer that fell behind (swarm and diloco): the model's
// parameters and buffers, the optimizer's state and the strategy's own tensors, as safetensors bytes
// (p2p/StateTransfer.h moves and verifies them); and how a peer's first worker shares what it
// downloaded with the peer's other workers.
//
//   const auto bytes = cohort::parallel::swarm::pack_peer_state(model, strategy_state.optimizer, {{"x", outer}});
//   auto state = cohort::parallel::swarm::unpack_peer_state(bytes);   // a peer that caught up
//   cohort::parallel::swarm::load_model_state(model, state);          // ConfigError when the models differ
#pragma once

#include <map>
#include <string>

#include <torch/nn/module.h>

#include "cohort/checkpoint/Safetensors.h"
#include "cohort/comm/Communicator.h"
#include "cohort/optim/Optimizer.h"
#include "cohort/util/OldNames.h"  // the names of the last release, for programs outside this tree

namespace cohort::parallel::swarm {

struct PeerState {
  std::map<std::string, at::Tensor> model;  // parameters and buffers by name
  optim::NamedState optimizer;
  checkpoint::NamedTensors extra;  // the strategy's own (diloco: the outer momentum)
};

std::string pack_peer_state(const torch::nn::Module& model, const optim::NamedState& optimizer,
                            const checkpoint::NamedTensors& extra);
PeerState unpack_peer_state(const std::string& bytes);
// Copies the parameters and buffers into `model`; a missing tensor or another shape is an error naming it.
void load_model_state(torch::nn::Module& model, const PeerState& state);

// A digest of the model's parameters (their bytes, in order): equal on two peers exactly when their
// weights are bitwise equal (Note [Peers that drifted apart resynchronize] in SwarmPeer.cpp). Buffers are
// left out: batch norm's running statistics are each peer's own.
uint64_t weights_digest(const torch::nn::Module& model);

// The peer's first worker's `bytes` and `step` to its other workers (a no-op for a peer of one worker).
void share_with_local_workers(comm::Communicator& comm, std::string& bytes, int64_t& step);

}  // namespace cohort::parallel::swarm

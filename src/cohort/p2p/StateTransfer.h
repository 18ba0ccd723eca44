// How a newcomer (or a peer that fell behind) gets the swarm's state from live peers, as Hivemind's
// load_state_from_peers does, without its failure modes (a donor that dies mid-transfer, every newcomer
// on the same donor, unchecked bytes): the state is cut into chunks; each chunk is asked of the donors in
// turn, starting at a different donor per newcomer; a donor that does not answer within `chunk_timeout_s`
// is skipped for the next; every chunk carries the donor's digest (BLAKE2b-256, libsodium) of the whole
// state, and the assembled state must match it.
//
//   p2p::StateServer server;                 // a live peer, between its steps:
//   server.serve(transport, step, [&] { return serialize_state(); });
//   auto got = p2p::download_state(transport, donors, 5.0, log);   // a newcomer
#pragma once

#include <array>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "cohort/p2p/Directory.h"
#include "cohort/p2p/Transport.h"

namespace cohort::p2p {

constexpr size_t kStateChunkBytes = size_t{1} << 20;

std::array<uint8_t, 32> state_digest(const std::string& bytes);

class StateServer {
 public:
  // Answers every state request that has arrived: with this peer's state at `step` (made once per step),
  // or for a download already under way, with the snapshot it started from while this peer holds it.
  void serve(Transport& transport, int64_t step, const std::function<std::string()>& make_state);

  // Fault injection (comm/FaultInjection.h lists every fault): asked for a chunk after sending this
  // many, the peer kills itself (SIGKILL) instead of answering: a donor dying mid-transfer. -1: never.
  int64_t fault_after_chunks = -1;

 private:
  int64_t chunks_sent_ = 0;
  int64_t step_ = -1;
  std::string state_;
  std::array<uint8_t, 32> digest_{};
};

struct DownloadedState {
  std::string bytes;
  int64_t step = 0;
  std::vector<std::string> donors;  // the peers chunks came from
  double seconds = 0;
};

// The state of the first donor that answers (its step in the result) from `donors` (live peers), every
// chunk of the same snapshot; nullopt, with the reason logged, when no donor delivered a verified copy.
// A donor for which `gone` says true when its turn comes is not asked (Note [A donor that left is not
// asked]).
std::optional<DownloadedState> download_state(Transport& transport, const std::vector<PeerRecord>& donors,
                                              double chunk_timeout_s,
                                              const std::function<void(const std::string&)>& log,
                                              const std::function<bool(const PeerKey&)>& gone = {});

}  // namespace cohort::p2p

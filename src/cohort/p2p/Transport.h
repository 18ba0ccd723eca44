// Authenticated messages between swarm peers, over ZeroMQ: each peer binds one TCP socket at its
// swarm.listen address and sends to the others through sockets that ZeroMQ connects (and reconnects) in
// the background. Every frame is sealed with the sender's token (p2p/Auth.h) and checked on arrival:
// a frame that is forged, altered, replayed or addressed to another peer is refused and named in the log.
//
//   p2p::Transport transport(identity, run_public_key, "10.0.0.2:7000");
//   transport.send(peer, "10.0.0.3:7000", {MessageKind::kPart, round, 1}, bytes);
//   auto reply = transport.receive({MessageKind::kResult, round, 1}, deadline);   // nullopt at the deadline
//
// Note [A swarm round never waits without a deadline]
// Peers die, freeze (SIGSTOP) and lose links mid-round. So sending never blocks (a frame for a peer whose
// queue is full is dropped and counted) and every receive takes a deadline: the caller decides what a
// missing message means (a contribution left out of the average, a part kept local), never a hang.
#pragma once

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "cohort/p2p/Auth.h"

namespace cohort::p2p {

using PeerKey = std::array<uint8_t, 32>;
using Clock = std::chrono::steady_clock;
// The deadline `seconds` after `t`: the swarm's settings give their waits in seconds.
inline Clock::time_point after(Clock::time_point t, double seconds) {
  return t + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

enum class MessageKind : uint8_t {
  kGroup = 1,       // a leader's group for a round: its members and their addresses
  kPart = 2,        // a member's contribution to the part another member reduces
  kResult = 3,      // a reduced part, back from the member that reduced it
  kReady = 4,       // a peer is ready for a round (with its address: a peer that has no record of it yet)
  kStateAsk = 5,    // a newcomer asks a live peer for a chunk of its state (p2p/StateTransfer.h)
  kStateChunk = 6,  // the answer; `round` is the step of the state
  kRecord = 7,      // a peer's sealed directory record, sent straight to the peers it knows (p2p/Directory.h)
  kRefused = 8,     // a peer of another run refuses this one (Note [A peer of another run is told so])
  kRecordAsk = 9,   // cohort doctor --ask: write your flight record (parallel/swarm/SwarmPeer.h, ask_for_records)
  kDeal = 10        // a leader tells the other peers which step and group key it dealt its groups' members
};

// A round number with this bit set is a parameter averaging (swarm.average_state_every), numbered by the
// step after it: round `step + 1` with the bit averages the weights the gradient round `step` produced.
inline constexpr uint64_t kParametersRound = uint64_t{1} << 62;

// What a message is about: its kind, the round (the swarm's global step) and the part.
struct Topic {
  MessageKind kind{};
  uint64_t round = 0;
  int64_t part = 0;
  bool operator<(const Topic& o) const { return std::tie(kind, round, part) < std::tie(o.kind, o.round, o.part); }
};

struct Message {
  PeerKey sender{};
  Topic topic;
  std::vector<uint8_t> body;
  // Addressed to whoever listens at this address, not to this peer's key: its sender does not hold this
  // peer's record live (a knock, or a heartbeat to a peer whose record expired there).
  bool to_anyone = false;
};

struct TransportStats {
  int64_t bytes_sent = 0, bytes_received = 0;
  int64_t record_bytes_sent =
      0;                    // of bytes_sent, the directory's records and deals (kRecord, kDeal), not averaging or state
  int64_t frames_sent = 0;  // frames that left, records included
  int64_t record_frames_sent = 0;  // of frames_sent, the directory's records and deals
  int64_t deal_bytes_sent = 0;     // of record_bytes_sent, the leaders' deals (kDeal)
  int64_t deal_frames_sent = 0;    // of record_frames_sent, the leaders' deals
  int64_t frames_with_mac = 0;     // frames sealed for one peer with a MAC rather than signed (seal_for)
  int64_t frames_dropped = 0;      // not sent: the peer's queue was full (dead, frozen or unreachable)
  int64_t frames_refused = 0;      // received and refused: a bad token, signature, replay or address
};

// "HOST:PORT" split; throws ConfigError naming `key` when it is not that.
std::pair<std::string, uint16_t> split_host_port(const std::string& address, const std::string& key);

class Transport {
 public:
  // Binds `listen` (HOST:PORT; port 0 picks a free one, see address()). `log` receives one line per
  // refused frame. Throws CommError naming the address when it cannot bind (a port in use).
  Transport(PeerIdentity me, PeerKey run_public_key, const std::string& listen,
            std::function<void(const std::string&)> log);
  ~Transport();
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  const PeerKey& key() const { return me_.token.peer_public_key; }
  const std::string& address() const { return address_; }

  // Seals and queues the frame for `to` at `address`; never blocks (Note [A swarm round never waits without a
  // deadline]).
  void send(const PeerKey& to, const std::string& address, Topic topic, const std::vector<uint8_t>& body);
  // The first message on `topic` (from `from`, when given) that arrived or arrives before `deadline`.
  std::optional<Message> receive(Topic topic, Clock::time_point deadline, const std::optional<PeerKey>& from = {});
  // The first message of `kind`, whatever its round and part (from `from`, when given), by `deadline`.
  std::optional<Message> receive_any(MessageKind kind, Clock::time_point deadline,
                                     const std::optional<PeerKey>& from = {});
  // Messages of `kind` go to `handler`, called on the I/O thread as each arrives, instead of the inbox: for
  // records, which the directory takes in at once and nobody waits for. Set it before they can arrive;
  // `nullptr` removes it and returns after its last call ended (its owner may then go).
  void on_arrival(MessageKind kind, std::function<void(const Message&)> handler);
  // Records and refusals from peers of another run (valid under the run key their token names, refused
  // for this run's) go to `handler` with that run key, instead of a line in the log per frame: the
  // directory tells such a peer, and is told, why (Note [A peer of another run is told so] in
  // p2p/DirectoryIdentity.cpp). Same lifetime rules as on_arrival.
  void on_foreign(std::function<void(const Message&, const PublicKey& run_key)> handler);
  // `peer` reads frames sealed for it alone, with `mac` (its record says so): they are sent so rather than
  // signed from now on (Note [A frame for one peer carries a MAC, not a signature] in p2p/Frame.cpp).
  void reads_pair_frames(const PeerKey& peer, PairMac mac);
  // Messages of averaging rounds before `round` are no longer wanted (late arrivals of finished rounds;
  // parameter averagings count by their number without kParametersRound).
  void forget_before(uint64_t round);
  TransportStats stats() const;

 private:
  struct Outgoing {
    std::string address;
    std::vector<uint8_t> frame;
    bool record = false;  // a kRecord or kDeal frame (TransportStats::record_bytes_sent)
    bool deal = false;    // a kDeal frame (TransportStats::deal_bytes_sent)
  };
  void run_io();
  void deliver(const uint8_t* data, size_t size);
  void flush_outgoing();

  PeerIdentity me_;
  PeerKey run_public_key_;
  std::string address_;
  std::function<void(const std::string&)> log_;
  ReplayGuard replay_;

  struct Sockets;  // ZeroMQ's context and sockets, owned by the I/O thread (zmq.hpp stays in the .cpp)
  std::unique_ptr<Sockets> sockets_;

  std::mutex send_mutex_;  // Note [Frames leave in the order of their counters]; guards pair_readers_ too
  std::map<PeerKey, PairMac> pair_readers_;
  mutable std::mutex mutex_;
  std::condition_variable arrived_;
  std::multimap<Topic, Message> inbox_;
  std::mutex handlers_mutex_;  // held while a handler runs
  std::map<MessageKind, std::function<void(const Message&)>> handlers_;
  std::function<void(const Message&, const PublicKey&)> foreign_;
  // A frame refused because its token is of another run: handed to foreign_ when it is a record or a
  // refusal that opens under its own run key. True when it was.
  bool deliver_foreign(const uint8_t* data, size_t size);
  std::deque<Outgoing> outbox_;
  TransportStats stats_;
  bool stopping_ = false;
  std::thread io_;
};

}  // namespace cohort::p2p

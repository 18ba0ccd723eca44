#include "cohort/p2p/Transport.h"

#include <chrono>
#include <ctime>
#include <zmq.hpp>

#include "cohort/p2p/Wire.h"
#include "cohort/util/Error.h"

namespace cohort::p2p {

namespace {

// A full send queue drops the frame (Note [A swarm round never waits without a deadline]). A peer has at
// most 2 kMaxPieces frames of a round in flight to another (its contribution and its result, in pieces:
// Note [A part travels in pieces] in p2p/Averager.cpp), and a round's weights may follow the gradients'
// before they left on a slow link: 64 leaves room for both rounds and the records.
constexpr int kSendQueueFrames = 64;
// The largest frame a peer accepts: a guard against a peer that announces an absurd size.
constexpr int64_t kMaxFrameBytes = int64_t{1} << 31;

int64_t now_unix() { return static_cast<int64_t>(std::time(nullptr)); }
uint64_t now_ns() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count());
}

std::string endpoint(const std::string& address) { return "tcp://" + address; }

// What open() says of a token of another run (check_token's words).
const std::string kAnotherRun = std::string("token refused: ") + kTokenOfAnotherRun;

// Note [zmq's hand-overs under ThreadSanitizer]
// zmq hands a frame's buffer between its I/O thread and ours through lock-free queues that TSan cannot
// see (libzmq is not instrumented). Each access across one was a race to TSan, suppressed (tests/tsan.supp)
// only after it had searched the whole buffer for the racy byte: a round of 4 MB parts took minutes, and
// make test-tsan timed out (SwarmAverager.PartsPastAPieceTravelInPiecesAndGiveTheBitsOfWholeParts, CI,
// 2026-12-06). So: a sent frame's buffer is released where zmq takes it and acquired where zmq gives it
// back to be freed; zmq's send() of it is not range-checked (intercept_send=0 in the tsan test preset);
// and this thread's copy of a received frame's body, which zmq's recv() wrote, is not checked. Nothing of
// this is in a build without TSan.
#if defined(__SANITIZE_THREAD__)
extern "C" void __tsan_acquire(void* address);
extern "C" void __tsan_release(void* address);
extern "C" void AnnotateIgnoreReadsBegin(const char* file, int line);
extern "C" void AnnotateIgnoreReadsEnd(const char* file, int line);
void handed_to_zmq(void* buffer) { __tsan_release(buffer); }
void given_back_by_zmq(void* buffer) { __tsan_acquire(buffer); }
void copy_received(const uint8_t* from, size_t size, std::vector<uint8_t>& into) {
  AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
  into.assign(from, from + size);
  AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
}
#else
void handed_to_zmq(void*) {}
void given_back_by_zmq(void*) {}
void copy_received(const uint8_t* from, size_t size, std::vector<uint8_t>& into) { into.assign(from, from + size); }
#endif

}  // namespace

std::pair<std::string, uint16_t> split_host_port(const std::string& address, const std::string& key) {
  const auto colon = address.rfind(':');
  const auto bad = [&](const std::string& why) {
    return ConfigError(key + "=" + address + ": " + why, "write HOST:PORT, e.g. " + key + "=10.0.0.2:7000");
  };
  if (colon == std::string::npos || colon == 0) throw bad("no HOST:PORT");
  const std::string host = address.substr(0, colon), port = address.substr(colon + 1);
  if (port.empty() || port.find_first_not_of("0123456789") != std::string::npos || port.size() > 5 ||
      std::stoi(port) > 65535)
    throw bad("the port is not a number from 0 to 65535");
  return {host, static_cast<uint16_t>(std::stoi(port))};
}

struct Transport::Sockets {
  zmq::context_t context{1};
  zmq::socket_t inbound{context, zmq::socket_type::router};
  zmq::socket_t wake_in{context, zmq::socket_type::pair};
  zmq::socket_t wake_out{context, zmq::socket_type::pair};
  std::map<std::string, zmq::socket_t> outbound;  // by address, connected on first use
};

Transport::Transport(PeerIdentity me, PeerKey run_public_key, const std::string& listen,
                     std::function<void(const std::string&)> log)
    : me_(std::move(me)), run_public_key_(run_public_key), log_(std::move(log)), sockets_(std::make_unique<Sockets>()) {
  auto [host, port] = split_host_port(listen, "swarm.listen");
  auto& s = *sockets_;
  s.inbound.set(zmq::sockopt::linger, 0);
  s.inbound.set(zmq::sockopt::maxmsgsize, kMaxFrameBytes);
  s.inbound.set(zmq::sockopt::rcvhwm, 0);  // inbound frames are bounded by what peers send in a round
  try {
    s.inbound.bind(endpoint(host + ":" + (port == 0 ? std::string("*") : std::to_string(port))));
  } catch (const zmq::error_t& e) {
    throw CommError("swarm.listen=" + listen + ": cannot listen there: " + e.what(),
                    "pick a free port (or another address of this machine) for swarm.listen");
  }
  // The bound address with the port the system picked, as peers reach it.
  const std::string bound = s.inbound.get(zmq::sockopt::last_endpoint);
  address_ = host + bound.substr(bound.rfind(':'));
  const std::string wake = "inproc://wake-" + std::to_string(reinterpret_cast<uintptr_t>(this));
  s.wake_in.bind(wake);
  s.wake_out.connect(wake);
  io_ = std::thread([this] { run_io(); });
}

Transport::~Transport() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    sockets_->wake_out.send(zmq::message_t(), zmq::send_flags::dontwait);
  }
  io_.join();
}

void Transport::send(const PeerKey& to, const std::string& address, Topic topic, const std::vector<uint8_t>& body) {
  // Note [Fewer copies of a frame's bytes]
  // An averaging part is megabytes, and each copy of it between the tensor and the socket cost about as
  // much as its MAC (docs/scaling.md, "The swarm's butterfly over the same links"). A part was copied five
  // times on its way out (encoded, after its weight, into the transport's buffer, into the sealed frame,
  // into zmq's message) and three on its way in (zmq's message into the opened payload, into the
  // message's body, into a tensor). Now: encoded once after its weight (encode_values), copied once into
  // the frame after room for its header and sealed where it lies (seal_in_place), and zmq takes that
  // buffer as it is (flush_outgoing); on the way in the frame is checked where zmq holds it
  // (open_in_place), its body copied once into the message (deliver), then decoded. Two copies each way;
  // the wire is unchanged.
  std::vector<uint8_t> room;
  room.reserve(kFrameOverheadBytes + 17 + body.size());  // 17: the topic's kind, round and part
  room.resize(kFrameHeaderBytes);
  Writer w(std::move(room));
  w.u8(static_cast<uint8_t>(topic.kind)).u64(topic.round).i64(topic.part).raw(body.data(), body.size());
  auto frame = w.take();
  // Note [Frames leave in the order of their counters]
  // A receiver refuses a counter lower than the last
  // it took from this sender (a replay). The directory's thread and the training thread both send, so
  // a counter is taken and its frame queued under one lock: otherwise a frame sealed first could be
  // queued second and refused (seen: averaging parts refused as replays once records went direct).
  std::lock_guard order(send_mutex_);
  bool mac = false;
  if (auto reader = pair_readers_.find(to); reader != pair_readers_.end())
    mac = seal_for_in_place(me_, to, next_counter(), frame, reader->second);
  else
    seal_in_place(me_, to, next_counter(), frame);
  std::lock_guard lock(mutex_);
  stats_.frames_with_mac += mac ? 1 : 0;
  // The directory's traffic, records and deals, is counted apart from the rounds' (TransportStats).
  const bool directory = topic.kind == MessageKind::kRecord || topic.kind == MessageKind::kDeal;
  outbox_.push_back({address, std::move(frame), directory, topic.kind == MessageKind::kDeal});
  sockets_->wake_out.send(zmq::message_t(), zmq::send_flags::dontwait);
}

void Transport::reads_pair_frames(const PeerKey& peer, PairMac mac) {
  std::lock_guard order(send_mutex_);
  pair_readers_[peer] = mac;
}

std::optional<Message> Transport::receive(Topic topic, Clock::time_point deadline, const std::optional<PeerKey>& from) {
  std::unique_lock lock(mutex_);
  std::optional<Message> found;
  arrived_.wait_until(lock, deadline, [&] {
    auto [first, last] = inbox_.equal_range(topic);
    for (auto it = first; it != last; ++it)
      if (!from || it->second.sender == *from) {
        found = std::move(it->second);
        inbox_.erase(it);
        return true;
      }
    return false;
  });
  return found;
}

std::optional<Message> Transport::receive_any(MessageKind kind, Clock::time_point deadline,
                                              const std::optional<PeerKey>& from) {
  std::unique_lock lock(mutex_);
  std::optional<Message> found;
  arrived_.wait_until(lock, deadline, [&] {
    for (auto it = inbox_.begin(); it != inbox_.end(); ++it)
      if (it->first.kind == kind && (!from || it->second.sender == *from)) {
        found = std::move(it->second);
        inbox_.erase(it);
        return true;
      }
    return false;
  });
  return found;
}

void Transport::on_arrival(MessageKind kind, std::function<void(const Message&)> handler) {
  std::lock_guard lock(handlers_mutex_);
  if (handler)
    handlers_[kind] = std::move(handler);
  else
    handlers_.erase(kind);
}

void Transport::on_foreign(std::function<void(const Message&, const PublicKey&)> handler) {
  std::lock_guard lock(handlers_mutex_);
  foreign_ = std::move(handler);
}

bool Transport::deliver_foreign(const uint8_t* data, size_t size) {
  auto opened = open_as_its_run(data, size, now_unix(), &me_);
  auto* o = std::get_if<Opened>(&opened);
  if (!o) return false;
  Message m;
  m.sender = o->token.peer_public_key;
  Reader r(o->payload);
  m.topic.kind = static_cast<MessageKind>(r.u8());
  m.topic.round = r.u64();
  m.topic.part = r.i64();
  // Records go to everyone (an all-zero receiver); a refusal must name this peer, or it is another's.
  const bool wanted =
      m.topic.kind == MessageKind::kRecord || (m.topic.kind == MessageKind::kRefused && o->receiver == key());
  if (!r.ok() || !wanted) return false;
  const size_t header = o->payload.size() - r.left();
  m.body.assign(o->payload.begin() + static_cast<std::ptrdiff_t>(header), o->payload.end());
  std::lock_guard lock(handlers_mutex_);
  if (!foreign_) return false;
  foreign_(m, o->token.run_public_key);
  return true;
}

void Transport::forget_before(uint64_t round) {
  std::lock_guard lock(mutex_);
  for (auto it = inbox_.begin(); it != inbox_.end();) {
    const auto kind = it->first.kind;
    const bool of_a_round = kind != MessageKind::kStateAsk && kind != MessageKind::kStateChunk;
    it = of_a_round && (it->first.round & ~kParametersRound) < round ? inbox_.erase(it) : std::next(it);
  }
}

TransportStats Transport::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

// The I/O thread: waits on the inbound socket and the wake-up pipe, checks each arriving frame, sends
// what send() queued. Only this thread touches the sockets after construction.
void Transport::run_io() {
  auto& s = *sockets_;
  std::vector<zmq::pollitem_t> items = {{s.inbound.handle(), 0, ZMQ_POLLIN, 0}, {s.wake_in.handle(), 0, ZMQ_POLLIN, 0}};
  for (;;) {
    zmq::poll(items, std::chrono::milliseconds(-1));
    if (items[1].revents & ZMQ_POLLIN) {
      zmq::message_t ignored;
      while (s.wake_in.recv(ignored, zmq::recv_flags::dontwait)) {
      }
    }
    if (items[0].revents & ZMQ_POLLIN) {
      zmq::message_t identity, frame;
      while (s.inbound.recv(identity, zmq::recv_flags::dontwait)) {
        if (!identity.more() || !s.inbound.recv(frame, zmq::recv_flags::dontwait)) continue;
        while (frame.more()) {  // a well-formed frame is one part; drain anything else
          zmq::message_t extra;
          if (!s.inbound.recv(extra, zmq::recv_flags::dontwait)) break;
          frame.move(extra);
        }
        deliver(static_cast<const uint8_t*>(frame.data()), frame.size());
      }
    }
    {
      std::lock_guard lock(mutex_);
      if (stopping_) break;
    }
    flush_outgoing();
  }
  s.outbound.clear();
}

void Transport::flush_outgoing() {
  std::deque<Outgoing> batch;
  {
    std::lock_guard lock(mutex_);
    batch.swap(outbox_);
  }
  // Counted when a frame leaves, as bytes_sent is: counted when queued, the records of frames dropped at a
  // full queue made "bytes sent less record bytes" negative (bench/scale.py at 64 peers).
  int64_t sent = 0, record_sent = 0, deal_sent = 0, dropped = 0, frames = 0, record_frames = 0, deal_frames = 0;
  for (auto& out : batch) {
    auto& sockets = sockets_->outbound;
    auto it = sockets.find(out.address);
    if (it == sockets.end()) {
      zmq::socket_t socket(sockets_->context, zmq::socket_type::dealer);
      socket.set(zmq::sockopt::linger, 0);
      socket.set(zmq::sockopt::sndhwm, kSendQueueFrames);
      socket.connect(endpoint(out.address));
      it = sockets.emplace(out.address, std::move(socket)).first;
    }
    const auto size = static_cast<int64_t>(out.frame.size());
    // zmq takes the frame's buffer rather than a copy (Note [Fewer copies of a frame's bytes]) and deletes it once
    // sent, or here with the message when the queue is full.
    auto held = std::make_unique<std::vector<uint8_t>>(std::move(out.frame));
    zmq::message_t message(
        held->data(), held->size(),
        [](void*, void* hint) {
          given_back_by_zmq(hint);
          delete static_cast<std::vector<uint8_t>*>(hint);
        },
        held.get());
    handed_to_zmq(held.release());  // the message owns it now
    if (it->second.send(message, zmq::send_flags::dontwait)) {
      sent += size;
      ++frames;
      if (out.record) {
        record_sent += size;
        ++record_frames;
      }
      if (out.deal) {
        deal_sent += size;
        ++deal_frames;
      }
    } else {
      ++dropped;
    }
  }
  std::lock_guard lock(mutex_);
  stats_.bytes_sent += sent;
  stats_.frames_sent += frames;
  stats_.record_frames_sent += record_frames;
  stats_.record_bytes_sent += record_sent;
  stats_.deal_frames_sent += deal_frames;
  stats_.deal_bytes_sent += deal_sent;
  stats_.frames_dropped += dropped;
}

void Transport::deliver(const uint8_t* data, size_t size) {
  auto opened = open_in_place(data, size, run_public_key_, now_unix(), &me_);
  std::string refused;
  Message m;
  if (auto* why = std::get_if<std::string>(&opened)) {
    refused = *why + " (claims to be peer " + claimed_sender(data, size) + ")";
  } else {
    auto& o = std::get<Opened>(opened);
    m.sender = o.token.peer_public_key;
    m.to_anyone = o.receiver == PublicKey{};
    refused = replay_.admit(m.sender, o.receiver, key(), o.counter, now_ns());
    Reader r(data + kFrameHeaderBytes, size - kFrameOverheadBytes);  // the payload, where it lies
    m.topic.kind = static_cast<MessageKind>(r.u8());
    m.topic.round = r.u64();
    m.topic.part = r.i64();
    if (refused.empty() && !r.ok()) refused = "a frame too short for its header";
    if (refused.empty()) {
      const size_t left = r.left();
      copy_received(r.take(left), left, m.body);  // Note [zmq's hand-overs under ThreadSanitizer]
    }
    if (!refused.empty()) refused += " (from peer " + peer_name(m.sender) + ")";
  }
  {
    std::lock_guard lock(mutex_);
    stats_.bytes_received += static_cast<int64_t>(size);
    if (!refused.empty()) ++stats_.frames_refused;
  }
  if (!refused.empty()) {
    if (std::holds_alternative<std::string>(opened) && std::get<std::string>(opened) == kAnotherRun &&
        deliver_foreign(data, size))
      return;
    log_("swarm: refused a frame: " + refused);
    return;
  }
  {
    // Called under handlers_mutex_, so that on_arrival(kind, nullptr) returns only after the last call.
    std::lock_guard lock(handlers_mutex_);
    if (auto it = handlers_.find(m.topic.kind); it != handlers_.end()) {
      it->second(m);
      return;
    }
  }
  {
    std::lock_guard lock(mutex_);
    if (stopping_) return;
    inbox_.emplace(m.topic, std::move(m));
  }
  arrived_.notify_all();
}

}  // namespace cohort::p2p

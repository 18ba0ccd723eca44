#include "cohort/p2p/StateTransfer.h"

#include <sodium.h>

#include <chrono>
#include <csignal>
#include <cstring>

#include "cohort/p2p/Wire.h"

namespace cohort::p2p {

namespace {

// Requests are kStateAsk messages (body: the asker's address, the snapshot's step or -1 for the current
// state); chunks are kStateChunk messages of round = the snapshot's step; `part` is the chunk.
// A request's body: the asker's address. A chunk's body: total size, digest, the chunk's bytes.
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// A chunk as it arrived: the whole state's size and digest, the snapshot's step, and this chunk's bytes
// (a view into the message's body, which must outlive it).
struct Chunk {
  uint64_t total = 0;
  std::array<uint8_t, 32> digest{};
  int64_t step = 0;
  const uint8_t* data = nullptr;
  size_t size = 0;
};

std::optional<Chunk> parse_chunk(const Message& m) {
  Reader r(m.body);
  Chunk c;
  c.total = r.u64();
  r.raw(c.digest.data(), c.digest.size());
  if (!r.ok() || c.total == 0 || c.total > (uint64_t{1} << 40)) return std::nullopt;
  c.step = static_cast<int64_t>(m.topic.round);
  c.size = r.left();
  c.data = r.take(c.size);
  return c;
}

// Asks `donor` for chunk `chunk` of the snapshot of step `wanted` (-1: its current state) and waits for
// it until `timeout_s`.
std::optional<Message> ask_chunk(Transport& transport, const PeerRecord& donor, int64_t chunk, int64_t wanted,
                                 double timeout_s) {
  Writer w;
  w.str(transport.address()).i64(wanted);
  transport.send(donor.key, donor.address, {MessageKind::kStateAsk, 0, chunk}, w.take());
  const auto deadline = after(Clock::now(), timeout_s);
  auto m = transport.receive_any(MessageKind::kStateChunk, deadline, donor.key);
  while (m && m->topic.part != chunk) m = transport.receive_any(MessageKind::kStateChunk, deadline, donor.key);
  return m;
}

// The first donor from `from` on (round the list) not marked dead; nullopt when all are.
std::optional<size_t> next_live(const std::vector<bool>& dead, size_t from) {
  for (size_t tried = 0; tried < dead.size(); ++tried, from = (from + 1) % dead.size())
    if (!dead[from]) return from;
  return std::nullopt;
}

}  // namespace

std::array<uint8_t, 32> state_digest(const std::string& bytes) {
  std::array<uint8_t, 32> out{};
  crypto_generichash(out.data(), out.size(), reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(),
                     nullptr, 0);
  return out;
}

void StateServer::serve(Transport& transport, int64_t step, const std::function<std::string()>& make_state) {
  for (;;) {
    auto ask = transport.receive_any(MessageKind::kStateAsk, Clock::now());
    if (!ask) return;
    Reader r(ask->body);
    const auto address = r.str();
    const auto wanted = r.i64();  // -1: the current state; else the step of the snapshot being downloaded
    if (!r.ok() || ask->topic.part < 0) continue;
    if (wanted < 0 && step_ != step) {
      state_ = make_state();
      digest_ = state_digest(state_);
      step_ = step;
    }
    // A snapshot this peer no longer holds: no answer, the asker goes to another donor.
    if (wanted >= 0 && wanted != step_) continue;
    if (chunks_sent_ == fault_after_chunks) ::raise(SIGKILL);
    const auto begin = static_cast<size_t>(ask->topic.part) * kStateChunkBytes;
    if (begin >= state_.size()) continue;
    const size_t n = std::min(kStateChunkBytes, state_.size() - begin);
    Writer w;
    w.u64(state_.size()).raw(digest_.data(), digest_.size()).raw(state_.data() + begin, n);
    transport.send(ask->sender, address, {MessageKind::kStateChunk, static_cast<uint64_t>(step_), ask->topic.part},
                   w.take());
    ++chunks_sent_;
  }
}

namespace {

// download_state's chunks, donor after donor; the donors `gone` passed by are added to `left`.
std::optional<DownloadedState> download_chunks(Transport& transport, const std::vector<PeerRecord>& donors,
                                               double chunk_timeout_s,
                                               const std::function<void(const std::string&)>& log,
                                               const std::function<bool(const PeerKey&)>& gone,
                                               std::vector<std::string>& left) {
  if (donors.empty()) return std::nullopt;
  const auto start = Clock::now();
  DownloadedState out;
  // Newcomers start at different donors (by their own key), so they do not all load the same one. Every
  // chunk comes from the same donor: two donors' states differ (batch-norm statistics are each peer's own).
  size_t next = transport.key()[0] % donors.size();
  std::optional<std::array<uint8_t, 32>> digest;
  uint64_t total = 0;
  int64_t chunks = 1;
  std::vector<bool> dead(donors.size(), false);
  for (int64_t chunk = 0; chunk < chunks;) {
    const auto live = next_live(dead, next);
    if (!live) {
      log("swarm: state download failed: no donor delivered chunk " + std::to_string(chunk));
      return std::nullopt;
    }
    next = *live;
    const auto& donor = donors[next];
    const bool has_left = gone && gone(donor.key);
    if (has_left) left.push_back(peer_name(donor.key));
    // The first chunk takes the donor's current state; the rest, that same snapshot (its step).
    const auto m =
        has_left ? std::nullopt : ask_chunk(transport, donor, chunk, digest ? out.step : -1, chunk_timeout_s);
    const auto c = m ? parse_chunk(*m) : std::nullopt;
    const bool other_state = c && digest && (*digest != c->digest || c->total != total || c->step != out.step);
    const std::string why = !m            ? "no answer within " + std::to_string(chunk_timeout_s) + " s"
                            : !c          ? "a malformed chunk"
                            : other_state ? "a state with another digest"
                                          : "";
    if (has_left || !why.empty()) {
      if (!has_left)
        log("swarm: state donor " + peer_name(donor.key) + " dropped for chunk " + std::to_string(chunk) + ": " + why);
      dead[next] = true;
      // Another donor holds another snapshot (its own step, its own batch-norm statistics): the download
      // starts over from it rather than mixing two states.
      if (chunk > 0 && (!m || other_state)) {
        digest.reset();
        out.bytes.clear();
        out.donors.clear();
        chunk = 0;
        chunks = 1;
      }
      continue;
    }
    if (!digest) {
      digest = c->digest;
      out.step = c->step;
      total = c->total;
      chunks = static_cast<int64_t>((total + kStateChunkBytes - 1) / kStateChunkBytes);
      out.bytes.reserve(total);
    }
    const size_t expected =
        std::min<uint64_t>(kStateChunkBytes, total - static_cast<uint64_t>(chunk) * kStateChunkBytes);
    if (c->size != expected) {
      log("swarm: state donor " + peer_name(donor.key) + " sent a chunk of the wrong size");
      dead[next] = true;
      continue;
    }
    out.bytes.append(reinterpret_cast<const char*>(c->data), c->size);
    const auto name = peer_name(donor.key);
    if (out.donors.empty() || out.donors.back() != name) out.donors.push_back(name);
    ++chunk;
  }
  if (state_digest(out.bytes) != *digest) {
    log("swarm: the downloaded state of step " + std::to_string(out.step) + " does not match its digest");
    return std::nullopt;
  }
  out.seconds = seconds_since(start);
  return out;
}

}  // namespace

// Note [A donor that left is not asked]
// The donors are the peers ahead when the download begins, and some leave while it goes on: at the end of
// a run the peers that finished exit while a late one downloads the last step. Each one asked would cost
// chunk_timeout_s: at 64 peers on 2 cores one late peer asked 38 donors that had all finished, 5 s each,
// and the run's last peer ended minutes after the others (bench/scale.py). So before a donor's turn the
// caller's `gone` (SwarmPeer asks its directory: the donor said it was leaving, or its record expired) can
// pass it by, as a donor that did not answer is; the names passed by are logged once, after the download.
std::optional<DownloadedState> download_state(Transport& transport, const std::vector<PeerRecord>& donors,
                                              double chunk_timeout_s,
                                              const std::function<void(const std::string&)>& log,
                                              const std::function<bool(const PeerKey&)>& gone) {
  std::vector<std::string> left;
  auto got = download_chunks(transport, donors, chunk_timeout_s, log, gone, left);
  std::string names;
  for (const auto& n : left) names += (names.empty() ? "" : ", ") + n;
  if (!left.empty())
    log("swarm: " + std::to_string(left.size()) + " state donor(s) not asked: they left the swarm (" + names + ")");
  return got;
}

}  // namespace cohort::p2p

#include "cohort/swarm/StateTransfer.h"

#include <sodium.h>

#include <chrono>
#include <csignal>
#include <cstring>

#include "cohort/swarm/Wire.h"

namespace cohort::swarm {

namespace {

// Requests are kStateAsk messages (body: the asker's address, the snapshot's step or -1 for the current
// state); chunks are kStateChunk messages of round = the snapshot's step; `part` is the chunk.
// A request's body: the asker's address. A chunk's body: total size, digest, the chunk's bytes.
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

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

std::optional<DownloadedState> download_state(Transport& transport, const std::vector<PeerRecord>& donors,
                                              double chunk_timeout_s,
                                              const std::function<void(const std::string&)>& log) {
  if (donors.empty()) return std::nullopt;
  const auto start = Clock::now();
  DownloadedState out;
  const auto ask_body = [&](int64_t wanted) {
    Writer w;
    w.str(transport.address()).i64(wanted);
    return w.take();
  };
  // Newcomers start at different donors (by their own key), so they do not all load the same one. Every
  // chunk comes from the same donor: two donors' states differ (batch-norm statistics are each peer's own).
  size_t next = transport.key()[0] % donors.size();
  std::optional<std::array<uint8_t, 32>> digest;
  uint64_t total = 0;
  int64_t chunks = 1;
  std::vector<bool> dead(donors.size(), false);
  for (int64_t chunk = 0; chunk < chunks;) {
    size_t tried = 0;
    while (tried < donors.size() && dead[next]) next = (next + 1) % donors.size(), ++tried;
    if (tried == donors.size()) {
      log("swarm: state download failed: no donor delivered chunk " + std::to_string(chunk));
      return std::nullopt;
    }
    const auto& donor = donors[next];
    // The first chunk takes the donor's current state; the rest, that same snapshot (its step).
    transport.send(donor.key, donor.address, {MessageKind::kStateAsk, 0, chunk}, ask_body(digest ? out.step : -1));
    const auto deadline =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(chunk_timeout_s));
    auto m = transport.receive_any(MessageKind::kStateChunk, deadline, donor.key);
    while (m && m->topic.part != chunk) m = transport.receive_any(MessageKind::kStateChunk, deadline, donor.key);
    std::string why;
    if (!m) why = "no answer within " + std::to_string(chunk_timeout_s) + " s";
    const std::vector<uint8_t> body = m ? std::move(m->body) : std::vector<uint8_t>{};
    Reader r(body);  // reads `body` in place: it must outlive the reader
    std::array<uint8_t, 32> their{};
    uint64_t size = 0;
    if (m) {
      size = r.u64();
      r.raw(their.data(), their.size());
      if (!r.ok() || size == 0 || size > (uint64_t{1} << 40))
        why = "a malformed chunk";
      else if (digest && (*digest != their || size != total || static_cast<int64_t>(m->topic.round) != out.step))
        why = "a state with another digest";
    }
    if (!why.empty()) {
      log("swarm: state donor " + peer_name(donor.key) + " dropped for chunk " + std::to_string(chunk) + ": " + why);
      dead[next] = true;
      // Another donor holds another snapshot (its own step, its own batch-norm statistics): the download
      // starts over from it rather than mixing two states.
      if (chunk > 0 && (!m || why == "a state with another digest")) {
        digest.reset();
        out.bytes.clear();
        out.donors.clear();
        chunk = 0;
        chunks = 1;
      }
      continue;
    }
    if (!digest) {
      digest = their;
      out.step = static_cast<int64_t>(m->topic.round);
      total = size;
      chunks = static_cast<int64_t>((total + kStateChunkBytes - 1) / kStateChunkBytes);
      out.bytes.reserve(total);
    }
    const size_t n = r.left();
    const size_t expected =
        std::min<uint64_t>(kStateChunkBytes, total - static_cast<uint64_t>(chunk) * kStateChunkBytes);
    if (n != expected) {
      log("swarm: state donor " + peer_name(donor.key) + " sent a chunk of the wrong size");
      dead[next] = true;
      continue;
    }
    const auto* bytes = r.take(n);
    out.bytes.append(reinterpret_cast<const char*>(bytes), n);
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

}  // namespace cohort::swarm

// Who may speak as a peer of this run: one identity is one live process (Note [One identity, one process]),
// and a peer of another run is told it was refused (Note [A peer of another run is told so]). Both halves
// of the directory that decide this are here; the records they read are p2p/Directory.cpp's.
#include <algorithm>
#include <cstdio>
#include <ctime>

#include "cohort/p2p/Directory.h"
#include "cohort/p2p/Wire.h"

namespace cohort::p2p {

namespace {

std::string seconds_text(double s) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f s", s);
  return text;
}

}  // namespace

std::string Directory::identity_taken() const {
  std::lock_guard lock(mutex_);
  return identity_taken_;
}

std::vector<Refusal> Directory::refusals() const {
  std::lock_guard lock(mutex_);
  std::vector<Refusal> out;
  for (const auto& [key, refusal] : refused_by_) out.push_back(refusal);
  return out;
}

// Note [One identity, one process]
// A token is one peer's identity. Given to two live processes (one token file copied to every machine),
// both announce one key: the others' records of it replace each other, each process takes the other's
// records for its own and ignores them, and every one of them trained alone, saying nothing (seen: three
// peers, each alone for a whole run). A peer restarted with its own token, after Ctrl-C or a crash within
// swarm.peer_ttl_s, announces the same key too, and must rejoin. A record says which process wrote it (a
// random session number) and when that process started:
// - A record of this key from another session that is leaving, or that was written before this process
//   started, is a predecessor's (after Ctrl-C, or a crash): no conflict.
// - Written after this process started by a process that started before it: the identity is taken.
//   This process stops, naming the fix (a token per peer): identity_taken(), which SwarmPeer checks
//   between steps. (Clocks of one machine, or of machines within the frames' 120 s replay window: a
//   restart on another machine whose clock runs ahead of the old one's could be taken for a twin.)
// - From a process that started after this one: this one goes on, logs it once, and answers with its
//   own record, so that the newer process learns the same within a heartbeat.
// Each process finds the other by knocking (it knows no live peer: every record it sees is its own
// key's) on its initial peers. When a third peer gets the key's records from both, it introduces them
// to each other (introduce_twins): each is sent the other's record.
void Directory::take_in_own_key(const PeerRecord& rec, Replies& replies) {
  if (rec.session == 0 || rec.session == session_ || rec.leaving) return;
  const bool it_is_older =
      rec.started_unix < started_unix_ || (rec.started_unix == started_unix_ && rec.session < session_);
  if (it_is_older) {
    if (rec.written_unix > started_unix_ && identity_taken_.empty())
      identity_taken_ = "peer " + peer_name(rec.key) + " is already live at " + rec.address +
                        ", in another process that started " + seconds_text(started_unix_ - rec.started_unix) +
                        " before this one with the same identity";
    return;
  }
  const double now = detail::unix_now();
  auto [at, first] = twins_answered_.try_emplace(rec.session, 0.0);
  if (first)
    log_("swarm: another process at " + rec.address + " uses this peer's identity (peer " + peer_name(rec.key) +
         ", the same swarm.token): it is told, and stops");
  if (now - at->second < options_.announce_s || mine_sealed_.empty()) return;
  at->second = now;
  replies.emplace_back(rec.address, detail::records_body({{mine_sealed_.data(), mine_sealed_.size()}}));
}

void Directory::introduce_twins(const Entry& held, const PeerRecord& rec, const uint8_t* data, size_t size,
                                Replies& replies) {
  const auto& old = held.record;
  if (held.sealed.empty() || old.session == 0 || rec.session == 0 || old.session == rec.session || old.leaving ||
      rec.leaving || old.written_unix < detail::unix_now() - options_.record_ttl_s)
    return;
  // Each written after the other started: two live processes, not a restart after a crash.
  if (old.written_unix <= rec.started_unix || rec.written_unix <= old.started_unix) return;
  const double now = detail::unix_now();
  auto& when = introduced_[{std::min(old.session, rec.session), std::max(old.session, rec.session)}];
  if (now - when < options_.announce_s) return;
  if (when == 0)
    log_("swarm: peer " + peer_name(rec.key) + " announces itself from two processes, at " + old.address + " and " +
         rec.address + " (one swarm.token in both): introducing them, so that the newer one stops");
  when = now;
  replies.emplace_back(rec.address, detail::records_body({{held.sealed.data(), held.sealed.size()}}));
  replies.emplace_back(old.address, detail::records_body({{data, size}}));
}

// Note [A peer of another run is told so]
// A peer whose token another run key signed (a token made with the wrong run.key, or swarm.insecure on
// one side only) is refused by every peer of this run: its frames are not this run's. It used to learn
// nothing (its DHT key is its own run's, where nobody is), and trained alone to the end. So a peer that
// refuses a knocking peer's record for being of another run answers it, at most every announce_s, with a
// kRefused frame sealed by its own token: a token of a run the knocking peer does not accept either, but
// one that proves the frame came from a peer of *that* run (open_as_its_run). The refused peer records
// who refused it and for which run key (refusals()); SwarmPeer stops it when such refusals are all it
// met. A refusal changes no state a run has: at worst, a forged one stops a peer that had met nobody.
void Directory::take_in_foreign(const Message& m, const PeerKey& run_key) {
  const double now = detail::unix_now();
  const std::string run = hex(run_key.data(), 4);
  if (m.topic.kind == MessageKind::kRefused) {
    Reader r(m.body);
    const auto address = r.str();
    std::unique_lock lock(mutex_);
    const bool first = refused_by_.find(m.sender) == refused_by_.end();
    refused_by_[m.sender] = {m.sender, r.ok() ? address : "an unknown address", run_key};
    lock.unlock();
    if (first)
      log_("swarm: peer " + peer_name(m.sender) + " at " + address + " refuses this peer: it belongs to run key " +
           run + "..., and this peer's token to run key " + hex(run_public_key_.data(), 4) + "...");
    return;
  }
  // A record of another run: whose, and where to answer.
  const auto records = detail::sealed_records(m.body);
  if (records.empty()) return;
  const auto [sealed, size] = records.front();
  auto opened = open_as_its_run(sealed, size, static_cast<int64_t>(std::time(nullptr)));
  auto* o = std::get_if<Opened>(&opened);
  if (!o) return;
  auto rec = detail::decode_record(o->payload, o->token.peer_public_key);
  if (!rec || rec->key != m.sender || rec->address.empty()) return;
  std::string address;
  {
    std::lock_guard lock(mutex_);
    auto [at, first] = refusal_sent_.try_emplace(m.sender, 0.0);
    if (now - at->second < options_.announce_s) return;
    at->second = now;
    address = mine_.address;
    if (first)
      log_("swarm: refused peer " + peer_name(m.sender) + " at " + rec->address +
           ": its token belongs to another run (run key " + run + "...); it is told so");
  }
  if (address.empty()) return;  // an observer answers nobody
  Writer w;
  w.str(address);
  transport_->send(m.sender, rec->address, {MessageKind::kRefused, 0, 0}, w.take());
}

}  // namespace cohort::p2p

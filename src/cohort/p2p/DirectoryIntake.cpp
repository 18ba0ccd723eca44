// What the directory takes in from other peers: their sealed records (kept when newer than the last of
// each peer) and their leaders' deals (Note [A leader deals its groups over the next round's keys] in
// p2p/Matchmaking.cpp). When it sends is p2p/Directory.cpp's, and to whom p2p/DirectorySend.cpp's; who
// may speak as a peer, p2p/DirectoryIdentity.cpp's.
#include <chrono>
#include <ctime>
#include <iterator>

#include "cohort/p2p/Directory.h"
#include "cohort/p2p/Wire.h"

namespace cohort::p2p {

void Directory::take_in(const uint8_t* data, size_t size, const PeerKey& carrier) {
  // Most records a heartbeat passes on are already here, at the same counter: dropped before their
  // signature is checked (Note [A token's signature is checked once] in p2p/Auth.cpp says what that costs).
  if (const auto claimed = claimed_header(data, size)) {
    std::lock_guard lock(mutex_);
    const auto held = records_.find(claimed->peer);
    if (held != records_.end() && claimed->counter <= held->second.counter) return;
  }
  auto opened = open_carried(data, size, run_public_key_, static_cast<int64_t>(std::time(nullptr)), carrier);
  if (auto* why = std::get_if<std::string>(&opened)) {
    const std::string line = "swarm: refused a record from peer " + claimed_sender(data, size) + ": " + *why;
    std::unique_lock lock(mutex_);
    if (!refused_logged_.insert(line).second) return;
    lock.unlock();
    log_(line);
    return;
  }
  auto& o = std::get<Opened>(opened);
  auto rec = detail::decode_record(o.payload, o.token.peer_public_key);
  if (!rec) return;
  Replies replies;
  {
    std::lock_guard lock(mutex_);
    if (rec->key == me_.token.peer_public_key) {
      take_in_own_key(*rec, replies);
    } else {
      auto& slot = records_[rec->key];
      if (o.counter <= slot.counter) return;
      introduce_twins(slot, *rec, data, size, replies);
      if (!rec->leaving && seen_.insert(rec->key).second) to_contact_.push_back(rec->address);
      if (transport_ && (rec->features & PeerRecord::kPairFrames))
        transport_->reads_pair_frames(
            rec->key, rec->features & PeerRecord::kPolyPairFrames ? PairMac::kPoly1305 : PairMac::kBlake2b);
      const double now = detail::unix_now();
      const bool met = slot.heard_unix() < now - options_.record_ttl_s;
      // A deal is done once the record gets there, and void once another process writes it (a restart).
      const auto deal = dealt_.find(rec->key);
      if (deal != dealt_.end() && (rec->step >= deal->second.step || rec->session != slot.record.session))
        dealt_.erase(deal);
      slot = {o.counter,
              std::move(*rec),
              std::vector<uint8_t>(data, data + size),
              met ? now : slot.met_unix,
              slot.vouched_unix,
              now};
    }
  }
  if (transport_)
    for (const auto& [address, body] : replies)
      transport_->send(PeerKey{}, address, {MessageKind::kRecord, 0, 0}, body);
}

// Note [A leader deals its groups over the next round's keys] (p2p/Matchmaking.cpp). Only from a live
// peer of the run (the frame is sealed by its sender, as any); a member whose record already reached the
// dealt step needs no deal, and one dealt two keys for a step by two leaders (two groups claimed it, and
// it kept one) is marked unknown, so that every leader waits for it as before.
void Directory::take_in_deal(const Message& m) {
  if (m.topic.round & kParametersRound) return;
  {
    std::lock_guard lock(mutex_);
    const auto sender = records_.find(m.sender);
    if (sender == records_.end() || sender->second.heard_unix() < detail::unix_now() - options_.record_ttl_s) return;
  }
  take_deal(static_cast<int64_t>(m.topic.round) + 1, detail::dealt_from(m.body), m.sender);
}

void Directory::take_deal(int64_t step, const std::vector<Dealt>& dealt, const PeerKey& from) {
  std::lock_guard lock(mutex_);
  // The deals of peers whose record expired go, now and then: a dead peer's would stay for good.
  const auto now = std::chrono::steady_clock::now();
  if (now - deals_pruned_ > std::chrono::seconds(10)) {
    deals_pruned_ = now;
    const double oldest = detail::unix_now() - options_.record_ttl_s;
    for (auto it = dealt_.begin(); it != dealt_.end();) {
      const auto held = records_.find(it->first);
      it = held == records_.end() || held->second.heard_unix() < oldest ? dealt_.erase(it) : std::next(it);
    }
  }
  for (const auto& d : dealt) {
    // Note [A deal vouches for its members] in p2p/DirectorySend.cpp: a deal for the record's step or a later
    // one, and no older than the last deal for it (a late one would bring a dead member back).
    if (d.key == me_.token.peer_public_key) {
      // Only a deal for this peer's step or a later one: a leader that is slower to move on may still
      // re-send one for a step this peer has left, which the others no longer believe.
      if (step >= mine_.step) {
        vouched_ = now;
        dealer_ = from;
      }
      continue;
    }
    const auto held = records_.find(d.key);
    const auto earlier = dealt_.find(d.key);
    if (held != records_.end() && held->second.record.step <= step &&
        (earlier == dealt_.end() || earlier->second.step <= step))
      held->second.vouched_unix = detail::unix_now();
    if (d.next_key == 0 || (held != records_.end() && held->second.record.step >= step)) continue;
    auto& deal = dealt_[d.key];
    if (deal.step == step && deal.key != d.next_key)
      deal.key = 0;
    else if (deal.step < step)
      deal = {step, d.next_key};
  }
}

}  // namespace cohort::p2p

// Whom the directory sends this peer's record to, and when it may skip a peer: a change to the peers that
// read it (Note [Readiness goes to the group]), the heartbeat and the peers it skips (Notes [A heartbeat
// skips the peers that heard this one lately] and [A deal vouches for its members]), a leader's deal and
// its re-sends (Note [A leader vouches for its members until its next round]), the records it passes on,
// answers and knocks. When it sends is Directory::run's (p2p/Directory.cpp); what it takes in,
// p2p/DirectoryIntake.cpp's.
#include <algorithm>
#include <chrono>

#include "cohort/p2p/Directory.h"
#include "cohort/p2p/Wire.h"

namespace cohort::p2p {

using std::chrono::duration;
using std::chrono::steady_clock;

// Note [Readiness goes to the group]
// Every change of a record went to every live peer: at each step a peer's step and then its readiness,
// 2 (N - 1) frames a peer a step (issue 41). With swarm.group_size, only the peers of its group key on its
// step read its readiness (the leader's survey in p2p/Matchmaking.cpp), and the others' count toward the
// target batch does not change when it turns ready: a peer on the step that is not ready counts as its
// samples plus a batch, one that is ready as its samples (SwarmPeer::ready), and a peer turns ready when
// its batch is in. (The batch counted is the reader's own: with peers of unequal batches the count is
// off by the difference until the next heartbeat or step, where before it was exact within milliseconds.
// Since, a peer counts only its key's peers anyway, and its samples go to them alone: Note [The target
// batch counted in the key and scaled to the swarm] in parallel/swarm/SwarmProgress.cpp.)
// So a change announced with Reach::kGroup (readiness, and the samples that make a peer ready) goes to
// those peers only, and to the others with the next heartbeat that goes to them (Note [A heartbeat skips
// the peers that heard this one lately]) or the next change of step. A change of step, leaving or
// group key still goes to everyone at once (a leader waits for any peer one step behind, which may come
// to its key), but for one its last round's leader dealt and told the others of (Reach::kDealt: Note [A
// leader deals its groups over the next round's keys] in p2p/Matchmaking.cpp). A peer that comes to the key after the
// ready one announced is told by matchmaking's ready message (Averager::tell_ready). Without swarm.group_size every key
// is 0 and every change goes to everyone, as before.
//
// To every peer in `to` a kRecord frame of this peer's record and, on a heartbeat to a few of them, some
// others' (Note [The heartbeat passes on a few records]).
void Directory::send_direct(const std::vector<uint8_t>& mine, uint64_t version, bool with_others, bool skip_heard,
                            const PeerRecord* group_of, const PeerRecord* grid_of) {
  std::vector<PeerRecord> to = with_others ? heartbeat_peers() : peers();
  if (group_of) {
    // A peer dealt to this step and key is on its way there, whatever its record says yet.
    const auto elsewhere = [&](const PeerRecord& record) {
      const auto p = as_dealt(record);
      return p.step != group_of->step || p.group_key != group_of->group_key;
    };
    to.erase(std::remove_if(to.begin(), to.end(), elsewhere), to.end());
  }
  const double live_since = detail::unix_now() - options_.record_ttl_s;
  const auto now = steady_clock::now();
  std::vector<Passed> others;
  std::set<PeerKey> gossip_to;
  if (with_others) others = gossip(to, gossip_to, grid_of);
  if (grid_of) {
    // A record whose coordinates are still dealt and that expired here is one from before its peer's stayed
    // (every peer knew every other in the first rounds): it is not heartbeaten for a minute.
    const auto apart = [&](const PeerRecord& p) {
      if (gossip_to.count(p.key)) return false;
      return grid_fixed(p) ? !grid_mates(p, *grid_of) : p.heard_unix < live_since;
    };
    to.erase(std::remove_if(to.begin(), to.end(), apart), to.end());
  }
  if (skip_heard) {
    PeerKey dealer{};
    const bool vouched = vouched_lately(now, dealer);
    to.erase(std::remove_if(to.begin(), to.end(),
                            [&](const PeerRecord& p) {
                              return !gossip_to.count(p.key) && p.key != dealer && p.heard_unix >= live_since &&
                                     (heard_lately(p.key, version, now) ||
                                      (vouched && (p.features & PeerRecord::kTakesDeals)));
                            }),
             to.end());
  }
  for (const auto& peer : to) {
    std::vector<detail::SealedRecord> records{{mine.data(), mine.size()}};
    if (gossip_to.count(peer.key)) {
      // Where coordinates stay, the records a peer can use are of the peers that share one with it.
      const bool mates_only = grid_of && grid_fixed(peer);
      for (const auto& p : others)
        if (p.record.key != peer.key && (!mates_only || grid_mates(p.record, peer)) && records.size() <= kGossipRecords)
          records.emplace_back(p.sealed.data(), p.sealed.size());
    }
    // To a peer whose record expired, addressed to whoever is there now, as a knock is: another process may
    // have taken its address.
    const bool live = peer.heard_unix >= live_since;
    transport_->send(live ? peer.key : PeerKey{}, peer.address, {MessageKind::kRecord, 0, 0},
                     detail::records_body(records));
    if (!with_others) sent_[peer.key] = {now, version};  // a heartbeat never excuses the next one
  }
}

// Note [A heartbeat skips the peers that heard this one lately]
// The heartbeat went to every live peer every announce_s, on top of each change of step, which also goes
// to every live peer: with steps shorter than announce_s it told each peer nothing a step had not told it
// half a second before, and it was N - 1 frames a peer a second, about half a peer's record frames at 64
// peers (bench/scale.py, issue 41). So it skips a live peer that, within record_ttl_s / 2 - announce_s,
// was sent a change of this peer's record (not a heartbeat: each beat would then excuse the next, halving
// the rate of an idle peer's) with every change meant for everyone (everyone_version_): that peer's copy
// is then never older than half a TTL when the next beat is due, and it holds all that a heartbeat would
// tell it but the changes sent to the group only (Note [Readiness goes to the group]), which the others do
// not read. Still sent the heartbeat: the peers it passes records on to (the newly met among them), the
// peers whose record here expired (Note [A peer whose record expired still hears the heartbeat]), every
// peer when the heartbeat carries a change not yet sent (readiness due to the group would otherwise wait
// for the next beat), and every peer while this one's steps are slower than that: a swarm stepping once a
// second or faster sends heartbeats only to the few it gossips to. The window is on the steady clock, so a
// step of the wall clock neither stretches nor cuts it.
duration<double> Directory::skip_window() const {
  return duration<double>(options_.record_ttl_s / 2 - options_.announce_s);
}

bool Directory::heard_lately(const PeerKey& peer, uint64_t version, steady_clock::time_point now) const {
  const auto sent = sent_.find(peer);
  return sent != sent_.end() && sent->second.version == version && now - sent->second.at < skip_window();
}

// Note [A deal vouches for its members]
// With swarm.group_size a change of step goes to the new key's peers only, the others told by the deal
// (Note [A leader deals its groups over the next round's keys] in p2p/Matchmaking.cpp), so the heartbeat
// went each second to every live peer outside the key: N - g frames a peer a second, the directory's
// last cost that grew with the swarm in every second (docs/scaling.md, "Where it stops"). Those peers read
// nothing in it that the deal did not tell them: the step and key it goes to (as_dealt), and that it is
// there. Its readiness and samples they do not read (Note [Readiness goes to the group]), and a change
// meant for everyone still goes to everyone at once. So a live leader's deal vouches for its members: each
// peer that hears it holds the members' records live for record_ttl_s from then, as if each had sent its
// own (PeerRecord::heard_unix), and a member that a deal named (heard as the others do: the leader sends it
// to its members too) skips, in its heartbeats for the same window as Note [A heartbeat skips the peers
// that heard this one lately], the live peers that read deals. A swarm whose rounds come every second or
// faster then sends, outside each key, a deal a group a round (N / g frames a peer a round) and the
// gossip's few heartbeats, where it sent N - g heartbeats a second. Still sent the heartbeat: the gossip's
// peers, peers of an earlier release (they do not read deals), peers whose record here expired (Note [A
// peer whose record expired still hears the heartbeat]: two peers that lost each other meet again), and
// every peer once no deal named this one for the window (a round that failed, or none: DiLoCo between
// its outer rounds). A peer the leader did not know hears no deal, and loses the members' records a TTL
// later; its heartbeat, which goes to expired peers too, then reaches them addressed to nobody, and they
// answer it with their record (Note [A heartbeat to nobody is answered]). A deal is believed from a live
// peer of the run only (its frame is sealed by its sender), only for the step of the member's record or
// a later one (a later record says more; the member, which believes a deal for its own step or a later
// one, may have reached the dealt step, and the gossip may have passed that record on), and only if no
// later deal for it came first (a late one would bring a dead member back). The gossip passes on the records live here,
// if only by a deal, so that a newcomer holds them for the deals to vouch for. Catch-up reads a donor's step as dealt
// (SwarmCatchUp.cpp).
bool Directory::vouched_lately(steady_clock::time_point now, PeerKey& dealer) const {
  std::lock_guard lock(mutex_);
  dealer = dealer_;
  return now - vouched_ < skip_window();
}

// Note [A leader vouches for its members until its next round]
// A deal vouched for its members for the heartbeat's window (Note [A deal vouches for its members]), about
// a second, and a swarm's rounds come that often only with small batches: with a target batch of many
// local steps, or a large model, a round comes every few seconds or minutes, and between rounds every
// member again sent its heartbeat to every live peer outside its key, N - g frames a peer a second
// (docs/scaling.md: about 750 kB/s a peer at 1,000 peers). So a leader keeps its deal standing: every
// three quarters of that window it re-sends it to the live peers, naming each member until that member's
// next round (its record past the dealt step, or a later deal for it heard here), and itself while it is
// on the dealt step. Its members stay vouched for everywhere until the next deal names them; stopping at
// the leader's own next round left gaps in which the members of slower keys heartbeat everyone. N / g
// frames a peer every 0.75 s in all, and none in a swarm whose rounds come faster. A member's heartbeat
// always goes to the leader that dealt it, and the leader names only the members whose heartbeat it heard
// within 1.5 beats: a member that dies is held live at most a TTL and 1.5 beats after its last heartbeat
// (a TTL before). A member believes a deal only for its step or a later one (a slow leader's deal for a
// step it has left no longer vouches for it elsewhere), and when its leader dies its heartbeat goes to
// everyone again after the window.
void Directory::deal(uint64_t round, const std::vector<Dealt>& dealt, const std::vector<PeerRecord>& to) {
  take_deal(static_cast<int64_t>(round) + 1, dealt);
  {
    std::lock_guard lock(mutex_);
    standing_ = {round, dealt, steady_clock::now()};
  }
  send_deal(round, dealt, to);
}

void Directory::send_deal(uint64_t round, const std::vector<Dealt>& dealt, const std::vector<PeerRecord>& to) {
  if (!transport_) return;
  const auto body = detail::deal_body(dealt);
  for (const auto& p : to) transport_->send(p.key, p.address, {MessageKind::kDeal, round, 0}, body);
}

void Directory::resend_deal() {
  std::vector<Dealt> dealt;
  uint64_t round = 0;
  {
    std::lock_guard lock(mutex_);
    if (standing_.dealt.empty()) return;
    // Three quarters of the window a deal vouches for (Note [A deal vouches for its members]): a re-send
    // arrives before it lapses, and a swarm whose rounds come within that sends none (half the window
    // re-sent once in each round of 0.6 s at 64 peers: twice the deal bytes, no heartbeat saved).
    const auto period = 0.75 * skip_window();
    const auto now = steady_clock::now();
    if (period.count() <= 0 || now - standing_.sent < period) return;
    standing_.sent = now;
    const int64_t step = static_cast<int64_t>(standing_.round) + 1;
    // A member's heartbeat comes every announce_s: one missed by half a beat, and it is not named, so that
    // a dead member is vouched for at most a TTL and 1.5 beats after its last.
    const double heard_since = detail::unix_now() - std::min(options_.record_ttl_s, 1.5 * options_.announce_s);
    for (const auto& d : standing_.dealt) {
      if (d.key == me_.token.peer_public_key) {
        if (!mine_.leaving && mine_.step <= step) dealt.push_back(d);
        continue;
      }
      // Until a later round of its own: its record past the step, or a later deal for it heard here.
      const auto held = records_.find(d.key);
      const auto later = dealt_.find(d.key);
      if (held != records_.end() && held->second.record.written_unix >= heard_since && !held->second.record.leaving &&
          held->second.record.step <= step && (later == dealt_.end() || later->second.step <= step))
        dealt.push_back(d);
    }
    if (dealt.empty() || mine_.leaving) standing_ = {};
    round = standing_.round;
  }
  if (dealt.empty()) return;
  take_deal(static_cast<int64_t>(round) + 1, dealt);
  send_deal(round, dealt, peers());
}

// Note [A heartbeat to nobody is answered]
// A peer whose record expired somewhere still hears that peer's heartbeat, addressed to whoever listens
// at its address (Note [A peer whose record expired still hears the heartbeat]), and the frame says so: it
// is not addressed to this peer's key. So this peer answers it with its record, at most every
// kMinAnswerGapS a peer. Without it, a member that deals vouch for skipped a peer that had lost its
// record for as long as the deals went on, since that peer heard no deal naming it (its leader did not
// know the peer, or the peer had lost the leader too: Note [A deal vouches for its members]), and only the
// gossip, at random, brought it back; a newcomer's knock is answered the same way.
void Directory::owe_record(const PeerKey& to) {
  std::lock_guard lock(mutex_);
  if (to == me_.token.peer_public_key) return;
  owed_.insert(to);
  changed_.notify_all();
}

void Directory::take_due_answers(std::set<PeerKey>& owed) {
  const auto now = steady_clock::now();
  for (auto it = owed.begin(); it != owed.end();) {
    const auto last = answered_.find(*it);
    const bool lately = last != answered_.end() && now - last->second < duration<double>(kMinAnswerGapS);
    it = lately ? owed.erase(it) : std::next(it);
  }
}

void Directory::answer(const std::vector<uint8_t>& mine, const std::set<PeerKey>& owed) {
  std::vector<std::pair<PeerKey, std::string>> to;  // addressed to the peer's key where it is live here
  {
    std::lock_guard lock(mutex_);
    const double live_since = detail::unix_now() - options_.record_ttl_s;
    for (const auto& key : owed)
      if (const auto held = records_.find(key); held != records_.end() && !held->second.record.leaving)
        to.emplace_back(held->second.heard_unix() >= live_since ? key : PeerKey{}, held->second.record.address);
  }
  const auto body = detail::records_body({{mine.data(), mine.size()}});
  for (const auto& [key, address] : to) transport_->send(key, address, {MessageKind::kRecord, 0, 0}, body);
  const auto now = steady_clock::now();
  for (const auto& key : owed) answered_[key] = now;
}

// Note [The heartbeat passes on a few records]
// Every record it knew went to every peer it knew, so
// each peer checked the signatures of every other's records once a second from every other peer:
// N^2 a peer, N^3 in all. At 32 peers on 2 cores that took most of the machine, and rounds failed for
// want of CPU (bench/scale.py, issue 41). So a heartbeat passes on a random kGossipRecords of them,
// drawn anew at each beat, and only to some peers: those it met in the last kWelcomeBeats beats (a
// newcomer, or a peer back after its record expired here, learns the swarm from every peer that meets
// it within a beat or two) and kGossipFanout others drawn at random (views that differ still merge).
// Passed to every peer, the 8 records made the heartbeat 9 records a peer a second from each of N - 1
// peers: 183 kB/s a peer at 64 peers against 67 at 8 (bench/scale.py); passed to a few, a peer at 64
// sends 0.67 times what one at 8 does (paired runs: bench/results/scale.json). Every peer still hears
// each live peer's own record from that peer at least every half TTL, which keeps each record live where
// it is known (Note [A heartbeat skips the peers that heard this one lately]).
std::vector<Directory::Passed> Directory::gossip(const std::vector<PeerRecord>& to, std::set<PeerKey>& gossip_to,
                                                 const PeerRecord* grid_of) {
  std::vector<Passed> others;
  std::lock_guard lock(mutex_);
  const double now = detail::unix_now(), oldest = now - options_.record_ttl_s;
  for (const auto& [key, entry] : records_)
    // Live here, if only by a deal: a peer that takes in a record older than its TTL holds it for the
    // deals to vouch for, and heartbeats it, addressed to nobody, until it answers (Notes [A deal vouches
    // for its members] and [A heartbeat to nobody is answered]).
    if (key != me_.token.peer_public_key && entry.heard_unix() >= oldest) {
      others.push_back({entry.record, entry.sealed});
      // Where coordinates stay, a peer that shares none is met and forgotten again and again (the gossip
      // brings its record, which its own heartbeat does not keep live here): it is not welcomed (Note [A
      // grid whose coordinates stay] in parallel/swarm/SwarmGrid.cpp).
      const bool apart = grid_of && grid_fixed(entry.record) && !grid_mates(entry.record, *grid_of);
      if (entry.met_unix >= now - kWelcomeBeats * options_.announce_s && !apart) gossip_to.insert(key);
    }
  std::shuffle(others.begin(), others.end(), gossip_random_);
  // Where coordinates stay, each peer it goes to is passed the records of its own mates: all are kept.
  if (!grid_of && others.size() > kGossipRecords) others.resize(kGossipRecords);
  std::vector<PeerKey> live;
  for (const auto& peer : to)
    if (!gossip_to.count(peer.key) && peer.heard_unix >= oldest) live.push_back(peer.key);
  std::shuffle(live.begin(), live.end(), gossip_random_);
  for (size_t i = 0; i < live.size() && i < kGossipFanout; ++i) gossip_to.insert(live[i]);
  return others;
}

// Note [A peer whose record expired still hears the heartbeat]
// A record that arrives after its TTL (a machine so loaded that frames wait seconds in queues) makes its
// peer dead to the receiver, which then stopped sending to it; when both sides of a pair did so they never
// met again. At 64 peers on 2 cores a swarm split so in two for good: 23 peers waited 300 s for the other
// 41 to start, while those trained among themselves (bench/scale.py, issue 41). The heartbeat also goes
// to the peers whose last record expired less than kHeartbeatAfterDeathS ago (and that did not say they
// were leaving), so the two sides meet again at the first record that arrives in time; a dead peer costs
// a minute of heartbeats to its address (addressed to whoever is there, as a knock is). Changes of step or
// readiness go to the live peers only.
std::vector<PeerRecord> Directory::heartbeat_peers() const {
  return written_since(detail::unix_now() - options_.record_ttl_s - kHeartbeatAfterDeathS);
}

// Note [A peer that knows nobody knocks]
// A peer that knows no live peer sends its record, every
// announce_s, to the addresses in swarm.initial_peers and to those of the peers it has seen (addressed to
// whoever is there: a newcomer does not know their keys yet). A live peer there takes it in like any record
// and, from its next heartbeat on, sends this peer its own record and every other it knows. Without it a
// peer found others only through the DHT, which in 1 of 3 runs of the four-peer test gave a newcomer
// nobody for a minute, and once left a peer that had lost its records for a few seconds alone to the end.
void Directory::knock(const std::vector<uint8_t>& mine) {
  std::set<std::string> addresses(initial_peers_.begin(), initial_peers_.end());
  {
    std::lock_guard lock(mutex_);
    for (const auto& [key, entry] : records_)
      if (key != me_.token.peer_public_key && !entry.record.leaving && addresses.size() < kMaxKnocks)
        addresses.insert(entry.record.address);
  }
  addresses.erase(mine_address_);
  const auto body = detail::records_body({{mine.data(), mine.size()}});
  for (const auto& address : addresses) transport_->send(PeerKey{}, address, {MessageKind::kRecord, 0, 0}, body);
}

}  // namespace cohort::p2p

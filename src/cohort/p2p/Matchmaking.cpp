// Matchmaking: which ready peers of a round average together, around which leader (Note [Matchmaking]),
// and with swarm.group_size how the ready peers of a key split into groups on a grid that changes from
// round to round (Note [Groups on a grid]). The all-reduce a group then runs is Averager.cpp's; both
// halves of the Averager are declared in p2p/Averager.h.
#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>

#include "cohort/p2p/Averager.h"
#include "cohort/p2p/Wire.h"

namespace cohort::p2p {

namespace {

// A peer about to take a cell of a grid that formed already, seen by a leader whose coordinates stay
// (`mine_stay`): one whose record says it forms the grid, whose coordinates do not stay yet, and which
// averaged in no group before (a newcomer; one forming the grid did). Where it settles is its own view's,
// and every leader on its step that waited out swarm.matchmaking_s for it held the whole swarm (a swarm
// doubled by newcomers: rounds of 2 to 3.8 s while they came).
bool settling_newcomer(const PeerRecord& p, bool mine_stay) {
  return mine_stay && !grid_fixed(p) && (p.features & PeerRecord::kFormsGrid) && p.group_size <= 1;
}

// Whether a leader whose coordinates stay on key `group_key` waits for `p`, a peer whose coordinates do
// not stay yet, for `round`: not a newcomer (settling_newcomer), and one that forms the grid only where
// its rank puts it on this key (Roster::key_at; where the roster does not name it, as before). DiLoCo's
// two outer rounds after the grid formed took 2.04 and 1.74 s where the dealt grid's took 0.54 and 0.46:
// a leader with its whole row ready waited for every peer still in its inner steps that was about to form.
bool may_come(const PeerRecord& p, int64_t round, uint64_t group_key, bool mine_stay, const Roster& roster) {
  if (settling_newcomer(p, mine_stay)) return false;
  if (!mine_stay || !(p.features & PeerRecord::kFormsGrid)) return true;
  const auto key = roster.key_at(p.key, round);
  return !key || *key == group_key;
}

// What matchmaking sees at one moment (Note [Matchmaking]).
struct Survey {
  std::vector<Member> ready;    // this peer and the others ready for the round, by key
  bool anyone_waiting = false;  // a live peer on the round, or finishing the one before, is not ready yet
  bool anyone_here = false;     // anyone besides this peer is on the round or about to be
  int64_t ahead_at = -1;        // the furthest step a live peer is at, when one is past the round
};

// Note [A starting peer names no group key]
// A peer announces step 0 as it starts, before it trains its first batch (parallel/swarm/SwarmPeer.cpp),
// and names its group key only when it announces that batch: until then its key is 0. With
// swarm.group_size every key in a round is above 0, and a leader took key 0 for another group's: the
// first peers to see swarm.min_peers_to_start peers (up to half a second before the rest: the wait reads
// the DHT every 0.5 s) closed the first round among themselves, and the rest found the swarm a step ahead,
// downloaded its state, and one of them was left to take the first step alone (bench/scale.py at 8 peers
// in a group of 8: a failed first round in 3 of 24 runs, and 13 of 39 once the heartbeat skipped peers,
// 2026-12-06; 0 of 16 since). So a peer on the round
// that names no key counts as one that may come to this key, as one a step behind does: the leader waits
// for it, up to swarm.matchmaking_s. Only one that has not averaged yet (its record's group_size is 0): a
// peer that names no key after its rounds runs without swarm.group_size (or is of an earlier release) and
// never comes to a key, so no leader waits on it at every round. Without swarm.group_size every key is 0,
// as before.
Survey survey(const std::vector<PeerRecord>& peers, int64_t round, const Member& me,
              const std::map<PeerKey, std::string>& said_ready, uint64_t group_key, bool mine_stay,
              const Roster& roster) {
  Survey s;
  // A peer that said it was ready but whose record is now past this step has closed the round in another
  // group: it is no longer here (counted, it kept a late peer waiting for a group that never came).
  std::map<PeerKey, int64_t> step_of;
  for (const auto& p : peers) step_of[p.key] = as_dealt(p).step;
  s.ready = {me};
  for (const auto& [key, address] : said_ready) {
    const auto at = step_of.find(key);
    if (at == step_of.end() || at->second <= round) s.ready.push_back({key, address});
  }
  bool anyone_on_round = false;
  // A peer dealt to the next step is seen there (Note [A leader deals its groups over the next round's keys]).
  for (const auto& record : peers) {
    const auto p = as_dealt(record);
    // A peer one step behind is finishing the last round and about to be ready for this one; one whose
    // coordinates stay, only if it comes to this key (Note [A grid whose coordinates stay] in
    // parallel/swarm/SwarmGrid.cpp); and a leader whose coordinates stay does not wait for a newcomer
    // about to settle (as below).
    if (p.step + 1 == round &&
        (grid_fixed(p) ? fixed_key_at(p, round) == group_key : may_come(p, round, group_key, mine_stay, roster)))
      s.anyone_waiting = true;
    if (p.step > round) s.ahead_at = std::max(s.ahead_at, p.step);
    if (p.step != round) continue;
    anyone_on_round = true;
    if (said_ready.count(p.key)) continue;
    // Another group's peer is neither ready for this one nor coming (Note [Groups on a grid]); a peer that
    // names no key yet may be (Note [A starting peer names no group key]).
    if (p.group_key != group_key) {
      if (p.group_key == 0 && p.group_size == 0 && !p.ready) s.anyone_waiting = true;
      // One whose coordinates are about to stay may take a cell on this key, and its record names its
      // dealt key until it does (Note [A grid whose coordinates stay] in parallel/swarm/SwarmGrid.cpp):
      // waited for until its record says where it went, which goes to everyone, where it may come here.
      if (mine_stay && !grid_fixed(p) && (p.features & PeerRecord::kFormsGrid) && !p.ready &&
          may_come(p, round, group_key, mine_stay, roster))
        s.anyone_waiting = true;
      continue;
    }
    if (p.ready)
      s.ready.push_back({p.key, p.address});
    else
      s.anyone_waiting = true;
  }
  s.anyone_here = s.ready.size() > 1 || s.anyone_waiting || anyone_on_round;
  std::sort(s.ready.begin(), s.ready.end(), [](const Member& a, const Member& b) { return a.key < b.key; });
  return s;
}

// A member's place in the shuffled order of a round's group (Note [Groups on a grid]): a hash of its key
// and the round, so that each round orders a group differently and every member computes the same order.
uint64_t shuffle_rank(const PeerKey& key, uint64_t round) {
  uint64_t x = round * 0x9E3779B97F4A7C15ULL;
  for (size_t i = 0; i < 8; ++i) x ^= uint64_t{key[i]} << (8 * i);
  x ^= x >> 30, x *= 0xBF58476D1CE4E5B9ULL, x ^= x >> 27, x *= 0x94D049BB133111EBULL, x ^= x >> 31;  // splitmix64
  return x;
}

}  // namespace

void Averager::send_group(uint64_t round, const std::vector<Member>& group, uint64_t first, uint64_t keys,
                          uint64_t swarm, const std::vector<uint64_t>& moved) {
  Writer w;
  w.u64(group.size());
  for (const auto& m : group) w.raw(m.key.data(), m.key.size()).str(m.address);
  w.u64(first);  // appended: a reader that stops before it takes 0
  w.u64(keys);   // appended: the next round's key count the leader dealt with (0: none dealt)
  w.u64(swarm);  // appended: the live peers the leader knows (0: not counted)
  // Appended: one past the coordinate each member moves to (0: it stays), as many as the members; none
  // where nobody moves.
  w.u64(moved.size());
  for (const auto c : moved) w.u64(c);
  const auto body = w.take();
  for (const auto& m : group)
    if (m.key != transport_.key()) transport_.send(m.key, m.address, {MessageKind::kGroup, round, 0}, body);
}

std::optional<std::vector<Member>> Averager::group_from(const Message& m) {
  Reader r(m.body);
  const uint64_t n = r.u64();
  if (!r.ok() || n == 0 || n > 4096) return std::nullopt;
  std::vector<Member> group(n);
  bool has_me = false;
  for (auto& member : group) {
    r.raw(member.key.data(), member.key.size());
    member.address = r.str();
    has_me = has_me || member.key == transport_.key();
  }
  if (!r.ok() || !has_me) return std::nullopt;
  said_.first = r.left() >= 8 ? r.u64() : 0;
  const uint64_t keys = r.left() >= 8 ? r.u64() : 0;
  said_.keys = keys <= kMaxGridKeys ? static_cast<int64_t>(keys) : 0;  // past that, not a count: its own
  const uint64_t swarm = r.left() >= 8 ? r.u64() : 0;
  said_.swarm = swarm <= kMaxSwarm ? static_cast<int64_t>(swarm) : 0;
  said_.moved = -1;
  if (r.left() >= 8 && r.u64() == n)
    for (const auto& member : group) {
      const uint64_t moved = r.u64();
      if (r.ok() && member.key == transport_.key() && moved > 0 && moved <= kMaxGridKeys)
        said_.moved = static_cast<int64_t>(moved) - 1;
    }
  return group;
}

// Note [Matchmaking]
// Every ready peer looks at the records of the peers on its step: the one with the smallest key among
// the ready ones leads. The leader sends the group as soon as every live peer on its step is ready, or
// when swarm.matchmaking_s has passed; the others wait for it. A peer that hears from a leader first
// joins that group, even if it thought it led (records reach peers at slightly different times). A
// leader that dies before sending leaves its followers with no group by twice the matchmaking time: they
// take a local step, and the next round forms without it.
std::vector<Member> Averager::match(uint64_t round, PeerRecord mine, std::string& problem) {
  if (options_.leaving && options_.leaving()) return withdraw(round, std::move(mine), problem);
  const auto start = Clock::now();
  const auto decide_at = after(start, options_.matchmaking_s);
  const auto give_up_at = after(start, 2 * options_.matchmaking_s + 1.0);
  const uint64_t group_key = mine.group_key;
  mine_ = mine;
  const Member me = say_ready(round, std::move(mine));
  std::map<PeerKey, std::string> said_ready;  // by message
  std::set<PeerKey> told;                     // the peers this one sent its ready message
  for (;;) {
    // A group of a past round that came after this peer had left it (it gave up waiting, or it was in
    // another group) is declined now, so its members stop waiting for this peer.
    decline_late_groups();
    hear_ready(round, group_key, said_ready);
    const auto peers = directory_.peers();
    tell_ready(round, me, group_key, peers, told);
    const auto s = survey(peers, static_cast<int64_t>(round), me, said_ready, group_key, grid_fixed(mine_), roster_);
    // A leader sends a member its group before the deal that shows the others past this step (Note [A
    // leader deals its groups over the next round's keys]): on one connection, so the group is here if
    // the deal was in `peers`. Taken first, it is not mistaken for the others leaving this peer behind.
    if (auto m = transport_.receive({MessageKind::kGroup, round, 0}, Clock::now()))
      if (auto group = group_from(*m)) return *group;
    // Note [A straggler does not wait for a group]
    // Every other live peer is past this step (they closed
    // its round without this peer, which came late: a newcomer whose download landed a step behind, a slow
    // or frozen peer). Nobody can join it any more, so it takes this step alone at once, and its next
    // catch_up downloads their state (Note [A peer that fell out of a round resynchronizes] in
    // parallel/swarm/SwarmPeer.cpp), instead of waiting out swarm.matchmaking_s while they move on.
    if (!s.anyone_here && s.ahead_at >= 0) {
      problem = "the other peers are past this step (at step " + std::to_string(s.ahead_at) + "): this step alone";
      return {me};
    }
    // Nobody else alive and no group required: a group of one at once (a lone peer trains as plain
    // training does). With swarm.min_group_size above 1 a lone peer waits for company as Hivemind's does.
    if (peers.empty() && options_.min_group_size <= 1) return {me};
    const bool leading = s.ready.front().key == me.key;
    const bool enough = static_cast<int64_t>(s.ready.size()) >= options_.min_group_size;
    if (leading && ((!s.anyone_waiting && enough) || Clock::now() >= decide_at)) {
      if (!enough) {
        problem = "only " + std::to_string(s.ready.size()) + " peer(s) ready after " +
                  std::to_string(options_.matchmaking_s) + " s (swarm.min_group_size " +
                  std::to_string(options_.min_group_size) + ")";
        return {me};
      }
      return send_groups(round, s.ready, group_key);
    }
    if (auto m = transport_.receive({MessageKind::kGroup, round, 0}, after(Clock::now(), 0.005)))
      if (auto group = group_from(*m)) return *group;
    if (options_.while_waiting) options_.while_waiting();
    if (Clock::now() >= give_up_at) {
      problem = "no group formed within " + std::to_string(2 * options_.matchmaking_s + 1.0) + " s";
      return {me};
    }
  }
}

// Note [Leaving a swarm] (train/Trainer.cpp): a peer told to stop before it said it was ready withdraws:
// its record says it is leaving, so nobody counts on it. Once it has said it is ready it stays for the
// round: a leader may already have sent a group naming it, and a member that vanished then would cost
// the others the averaging timeout and leave them apart (each keeps its own values for its part).
std::vector<Member> Averager::withdraw(uint64_t round, PeerRecord mine, std::string& problem) {
  mine.step = static_cast<int64_t>(round);
  mine.ready = false;
  mine.leaving = true;
  mine.address = transport_.address();
  directory_.announce(mine);
  problem = "leaving: no group for this step";
  return {{transport_.key(), transport_.address()}};
}

// Readiness goes into this peer's record, to the peers of its group key (Note [Readiness goes to the
// group] in p2p/DirectorySend.cpp); the ready messages of match's loop go to the same peers at once.
Member Averager::say_ready(uint64_t round, PeerRecord mine) {
  mine.step = static_cast<int64_t>(round);
  mine.ready = true;
  mine.address = transport_.address();
  directory_.announce(mine, Directory::Reach::kGroup);
  return {transport_.key(), transport_.address()};
}

// Only to the peers of its group key (all of them without swarm.group_size): the others would drop it. A
// peer that comes to the key later, after its last round, hears it then.
void Averager::tell_ready(uint64_t round, const Member& me, uint64_t group_key, const std::vector<PeerRecord>& peers,
                          std::set<PeerKey>& told) {
  std::vector<uint8_t> body;
  for (const auto& record : peers) {
    const auto p = as_dealt(record);  // one dealt to this key is on its way (a deal comes before its step)
    if (p.step != static_cast<int64_t>(round) || p.group_key != group_key || !told.insert(p.key).second) continue;
    if (body.empty()) {
      Writer hello;
      hello.str(me.address).u64(group_key);
      body = hello.take();
    }
    transport_.send(p.key, p.address, {MessageKind::kReady, round, 0}, body);
  }
}

void Averager::hear_ready(uint64_t round, uint64_t group_key, std::map<PeerKey, std::string>& said_ready) {
  while (auto m = transport_.receive({MessageKind::kReady, round, 0}, Clock::now())) {
    Reader r(m->body);
    const auto address = r.str();
    const uint64_t key = r.left() >= 8 ? r.u64() : 0;
    if (r.ok() && key == group_key) said_ready[m->sender] = address;
  }
}

int64_t group_count(int64_t ready, int64_t group_size, int64_t min_group_size) {
  // A lone member learns nothing from the round and leaves it out of step with the others.
  int64_t groups = (ready + group_size - 1) / group_size;
  while (groups > 1 && ready / groups < std::max<int64_t>(2, min_group_size)) --groups;
  return groups;
}

// Note [Groups on a grid]
// With swarm.group_size = M, a round's groups hold at most M peers, so that a peer's work and bytes per
// round do not grow with the swarm. Groups smaller than the swarm average only among themselves, so they
// must change from round to round for averages to mix across it: Moshpit SGD's grid (arXiv 2103.03239).
// Each peer holds two coordinates (c0, c1). In round r it averages along dimension d = r mod 2, with the
// peers that share its other coordinate c[1 - d]: that is its group key, announced in its record and its
// ready message, so peers agree on their group from what each says of itself, whatever each one's view of
// who is ready. The peers of one key form one group, or, past M, ceil(n / M) groups of nearly equal size,
// in an order shuffled per round (shuffle_rank); fewer where the smallest would be one peer or below
// swarm.min_group_size (with M = 2 three ready peers form one group of three, not a pair and a peer alone). After the
// round each member sets c[d] to its place in its group modulo G = round(N / M) for the N peers its leader knows, but
// at most N / 2 (the leader sends G: Note [A leader deals its groups over the next round's keys]): with M = 2 and N =
// 3, G = 2 dealt one peer a key of its own at every round, where it waited out swarm.matchmaking_s alone (13 and 14 of
// the 3 survivors' 48 steps failed in SwarmLong.AGroupWhoseRoundWentWrong... once the fourth peer had died; 6 to 8 with
// the bound). The members of one group spread over G keys for the next round, which gathers members from different
// groups. Mixing: on a full grid (N = G x M, no failures) round r averages the rows and round r + 1 the columns, so
// after two rounds every peer holds the global average of what the first round started from. With N not G x M, with
// peers late or lost, or with views of N that differ (G is rounded, so a few peers more or less seldom change it),
// groups are uneven and some peers miss a round; simulated (64 peers, M = 8, 5% missing each round) the spread of
// values between peers still fell about tenfold every two rounds, and the mean group was 6.6 of 8. With M = 0 every key
// is 0: one group of every ready peer, as before.
std::vector<Member> Averager::send_groups(uint64_t round, std::vector<Member> ready, uint64_t group_key) {
  const auto m = options_.group_size;
  if (m <= 0) {
    send_group(round, ready, 0, 0, 0);
    return ready;
  }
  std::sort(ready.begin(), ready.end(),
            [&](const Member& a, const Member& b) { return shuffle_rank(a.key, round) < shuffle_rank(b.key, round); });
  const int64_t n = static_cast<int64_t>(ready.size()), groups = group_count(n, m, options_.min_group_size);
  const auto peers = directory_.peers();
  const int64_t keys = grid_keys(static_cast<int64_t>(peers.size()) + 1, m);
  std::vector<Member> mine;
  std::vector<Dealt> dealt;
  // Note [An overfull key splits]: where coordinates stay, the peers past a group's worth move.
  const auto moves = grid_fixed(mine_) && n > m ? plan_split(round, group_key, n, peers) : std::vector<uint64_t>{};
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t first = n * g / groups;
    const std::vector<Member> group(ready.begin() + first, ready.begin() + n * (g + 1) / groups);
    std::vector<uint64_t> moved;
    if (!moves.empty()) moved.assign(moves.begin() + first, moves.begin() + n * (g + 1) / groups);
    if (std::all_of(moved.begin(), moved.end(), [](uint64_t c) { return c == 0; })) moved.clear();
    send_group(round, group, static_cast<uint64_t>(first), static_cast<uint64_t>(keys), peers.size() + 1, moved);
    for (size_t j = 0; j < group.size(); ++j) {
      if (group[j].key == transport_.key())
        mine = group, said_.first = static_cast<uint64_t>(first),
        said_.moved = moved.empty() ? -1 : static_cast<int64_t>(moved[j]) - 1;
      const int64_t place = first + static_cast<int64_t>(j);
      if (group.size() > 1 && takes_deals(peers, group[j].key) && !keeps_coordinates(peers, group[j].key))
        dealt.push_back({group[j].key, next_group_key(group_key, round, place, keys)});
    }
  }
  said_.keys = keys;
  said_.swarm = static_cast<int64_t>(peers.size()) + 1;
  // On a grid of one key every member goes to it, and every leader waits for every peer a step behind
  // anyway: a deal would tell nobody anything (8 peers in groups of 8: 7 frames a round for nothing).
  if (keys > 1) send_deal(round, peers, dealt);
  return mine;
}

int64_t grid_keys(int64_t known, int64_t group_size) {
  const auto rounded = std::llround(static_cast<double>(known) / static_cast<double>(group_size));
  return std::max<int64_t>(1, std::min<int64_t>(rounded, known / 2));
}

// The peers of one key are dealt round-robin over the next round's keys, from a start that depends on the
// key and the round, so that the next round's keys get equal shares of every key's peers. The next round
// averages along the other dimension: its key is the coordinate this round sets.
uint64_t next_group_key(uint64_t key, uint64_t round, int64_t place, int64_t keys) {
  const uint64_t start = (key * 0x9E3779B97F4A7C15ULL + round) >> 33;
  const uint64_t coordinate =
      (start + static_cast<uint64_t>(place)) % static_cast<uint64_t>(std::max<int64_t>(1, keys));
  return 1 + (((round + 1) % 2) << 32) + coordinate;  // never 0: that is "any group"
}

// A member whose coordinates stay goes to the key its record names: no deal is needed (Note [A grid whose
// coordinates stay] in parallel/swarm/SwarmGrid.cpp).
bool Averager::keeps_coordinates(const std::vector<PeerRecord>& peers, const PeerKey& key) const {
  if (key == transport_.key()) return grid_fixed(mine_);
  return std::any_of(peers.begin(), peers.end(), [&](const PeerRecord& p) { return p.key == key && grid_fixed(p); });
}

// A peer of an earlier release counts the grid's keys itself, so its key may not be the one a deal names.
bool Averager::takes_deals(const std::vector<PeerRecord>& peers, const PeerKey& key) const {
  if (key == transport_.key()) return true;
  return std::any_of(peers.begin(), peers.end(),
                     [&](const PeerRecord& p) { return p.key == key && (p.features & PeerRecord::kTakesDeals); });
}

// Note [A leader deals its groups over the next round's keys]
// With swarm.group_size a leader waited for every live peer one step behind, whatever its key: such a peer
// may be dealt to the leader's key when its own round ends (Note [Groups on a grid]). So each step was a
// barrier for the whole swarm, and each change of step had to reach every peer at once: N frames a peer a
// step (issue 41; docs/scaling.md, "Where it stops"). But the deal is the leader's: it knows each member's
// place, and it now sends the key count it dealt with in the group message, so that its members take the
// keys it computed (next_group_key) rather than each its own count of the swarm. So it tells the other live
// peers it knows, in one kDeal frame, which key each member of its groups goes to for the next step; their
// directories show such a member on that step with that key (as_dealt) until its record gets there. A
// leader of the next step then waits only for the peers dealt its key and for those whose deal it did not
// hear (as before), and a member's change of step goes to its new key's peers only (Reach::kDealt), the
// rest learning it from the deal and the next heartbeat. A peer hears G = N / M deals a step instead of N
// changes of step. What can go wrong is waiting: a member in two groups (two leaders claimed it: Note [A
// peer in two groups declines the other]) is dealt twice, and the directory then forgets both deals; a
// member whose round ended alone (it gave up before the group came) takes another key and announces it to
// everyone, as does a member that declined another group for the round; a peer the leader did not know
// hears no deal and waits for the member's heartbeat. A peer of an earlier release is not dealt (its key
// may differ), and while one is live nobody announces a dealt step to the new key alone. The members
// hear the deal too: those dealt to one key (a group larger than the grid's keys, or groups of one key
// dealt together) send each other their new step and readiness at once.
void Averager::send_deal(uint64_t round, const std::vector<PeerRecord>& peers, const std::vector<Dealt>& dealt) {
  if (dealt.empty()) return;
  directory_.deal(round, dealt, peers);  // re-sent until the members' next rounds (p2p/DirectorySend.cpp)
}

}  // namespace cohort::p2p

#include "cohort/p2p/Averager.h"

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstring>
#include <map>
#include <thread>

#include "cohort/p2p/Wire.h"
#include "cohort/util/Error.h"

namespace cohort::p2p {

namespace {

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
Clock::time_point after(Clock::time_point t, double seconds) {
  return t + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

// The weight, then the values, encoded into one buffer (Note [Fewer copies of a frame's bytes] in p2p/Transport.cpp).
std::vector<uint8_t> encode_values(double weight, const at::Tensor& values, Codec codec) {
  std::vector<uint8_t> out;
  out.reserve(8 + static_cast<size_t>(encoded_bytes(values.numel(), codec)));
  Writer w(std::move(out));
  w.f64(weight);
  auto body = w.take();
  encode(values, codec, body);
  return body;
}

// A contribution or a result of weight 0 and no values: the sender declines the round's group (Note [A
// peer in two groups declines the other]).
bool declined(const Message& m) {
  Reader r(m.body);
  return r.f64() == 0.0 && r.ok() && r.left() == 0;
}

// A contribution or a result: a positive weight and exactly `numel` finite values, or nothing (malformed).
std::optional<std::pair<double, at::Tensor>> decode_values(const std::vector<uint8_t>& body, int64_t numel,
                                                           Codec codec) {
  Reader r(body);
  const double weight = r.f64();
  if (!r.ok() || !(weight > 0) || !std::isfinite(weight)) return std::nullopt;
  const size_t left = r.left();
  auto values = decode(r.take(left), left, numel, codec);
  if (!values) return std::nullopt;
  return std::make_pair(weight, *values);
}

// What matchmaking sees at one moment (Note [Matchmaking]).
struct Survey {
  std::vector<Member> ready;    // this peer and the others ready for the round, by key
  bool anyone_waiting = false;  // a live peer on the round, or finishing the one before, is not ready yet
  bool anyone_here = false;     // anyone besides this peer is on the round or about to be
  int64_t ahead_at = -1;        // the furthest step a live peer is at, when one is past the round
};

Survey survey(const std::vector<PeerRecord>& peers, int64_t round, const Member& me,
              const std::map<PeerKey, std::string>& said_ready, uint64_t group_key);

// A member's place in the shuffled order of a round's group (Note [Groups on a grid]): a hash of its key
// and the round, so that each round orders a group differently and every member computes the same order.
uint64_t shuffle_rank(const PeerKey& key, uint64_t round) {
  uint64_t x = round * 0x9E3779B97F4A7C15ULL;
  for (size_t i = 0; i < 8; ++i) x ^= uint64_t{key[i]} << (8 * i);
  x ^= x >> 30, x *= 0xBF58476D1CE4E5B9ULL, x ^= x >> 27, x *= 0x94D049BB133111EBULL, x ^= x >> 31;  // splitmix64
  return x;
}

}  // namespace

std::pair<int64_t, int64_t> part_bounds(int64_t numel, int64_t n, int64_t j, int64_t align) {
  const int64_t blocks = (numel + align - 1) / align;
  return {std::min(numel, blocks * j / n * align), std::min(numel, blocks * (j + 1) / n * align)};
}

at::Tensor weighted_mean(const std::vector<at::Tensor>& values, const std::vector<double>& weights) {
  COHORT_ASSERT(!values.empty() && values.size() == weights.size(), "weighted_mean: one weight per value");
  double total = 0;
  for (double w : weights) total += w;
  // A single contribution is returned as it is: a group of one changes no bit.
  if (values.size() == 1) return values[0].clone();
  auto out = at::zeros_like(values[0]);
  for (size_t k = 0; k < values.size(); ++k) out.add_(values[k], weights[k] / total);
  return out;
}

Averager::Averager(Transport& transport, Directory& directory, AveragingOptions options)
    : transport_(transport), directory_(directory), options_(options) {}

RoundOutcome Averager::average(uint64_t round, const at::Tensor& flat, double weight, PeerRecord mine) {
  const auto start = Clock::now();
  std::string problem;
  first_place_ = 0;
  const auto group = match(round, std::move(mine), problem);
  const double matchmaking = seconds_since(start);
  auto out = all_reduce(round, group, flat, weight);
  recent_.emplace_back(round, group);
  while (recent_.size() > kRecentRounds) recent_.pop_front();
  decline_late_groups();
  out.matchmaking_s = matchmaking;
  for (size_t j = 0; j < group.size(); ++j)
    if (group[j].key == transport_.key()) out.place = static_cast<int64_t>(first_place_ + j);
  if (out.problem.empty()) out.problem = problem;
  // Late groups of the last rounds are declined while the next ones run (decline_late_groups), then
  // forgotten.
  transport_.forget_before(round + 1 >= kRecentRounds ? round + 1 - kRecentRounds : 0);
  return out;
}

void Averager::send_group(uint64_t round, const std::vector<Member>& group, uint64_t first) {
  Writer w;
  w.u64(group.size());
  for (const auto& m : group) w.raw(m.key.data(), m.key.size()).str(m.address);
  w.u64(first);  // appended: a reader that stops before it takes 0
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
  first_place_ = r.left() >= 8 ? r.u64() : 0;
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
  const Member me = say_ready(round, std::move(mine));
  std::map<PeerKey, std::string> said_ready;  // by message
  for (;;) {
    // A group of a past round that came after this peer had left it (it gave up waiting, or it was in
    // another group) is declined now, so its members stop waiting for this peer.
    decline_late_groups();
    hear_ready(round, group_key, said_ready);
    const auto peers = directory_.peers();
    const auto s = survey(peers, static_cast<int64_t>(round), me, said_ready, group_key);
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
      return send_groups(round, s.ready);
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

// Readiness goes into this peer's record and to the peers on this step directly too: a DHT record takes
// 0.1 to 1 s to be read.
Member Averager::say_ready(uint64_t round, PeerRecord mine) {
  mine.step = static_cast<int64_t>(round);
  mine.ready = true;
  mine.address = transport_.address();
  directory_.announce(mine);
  const Member me{transport_.key(), transport_.address()};
  Writer hello;
  hello.str(me.address).u64(mine.group_key);
  const auto body = hello.take();
  // Only to the peers of its group key (all of them without swarm.group_size): the others would drop it.
  for (const auto& p : directory_.peers())
    if (p.step == static_cast<int64_t>(round) && p.group_key == mine.group_key)
      transport_.send(p.key, p.address, {MessageKind::kReady, round, 0}, body);
  return me;
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
// round each member sets c[d] to its place in its group modulo G = round(N / M) for the N peers it knows: the members
// of one group spread over G keys for the next round, which gathers members from different groups. Mixing: on a full
// grid (N = G x M, no failures) round r averages the rows and round r + 1 the columns, so after two rounds every peer
// holds the global average of what the first round started from. With N not G x M, with peers late or lost, or with
// views of N that differ (G is rounded, so a few peers more or less seldom change it), groups are uneven and some peers
// miss a round; simulated (64 peers, M = 8, 5% missing each round) the spread of values between peers still fell about
// tenfold every two rounds, and the mean group was 6.6 of 8. With M = 0 every key is 0: one group of every ready peer,
// as before.
std::vector<Member> Averager::send_groups(uint64_t round, std::vector<Member> ready) {
  const auto m = options_.group_size;
  if (m <= 0) {
    send_group(round, ready, 0);
    return ready;
  }
  std::sort(ready.begin(), ready.end(),
            [&](const Member& a, const Member& b) { return shuffle_rank(a.key, round) < shuffle_rank(b.key, round); });
  const int64_t n = static_cast<int64_t>(ready.size()), groups = group_count(n, m, options_.min_group_size);
  std::vector<Member> mine;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t first = n * g / groups;
    const std::vector<Member> group(ready.begin() + first, ready.begin() + n * (g + 1) / groups);
    send_group(round, group, static_cast<uint64_t>(first));
    for (const auto& member : group)
      if (member.key == transport_.key()) mine = group, first_place_ = static_cast<uint64_t>(first);
  }
  return mine;
}

namespace {

Survey survey(const std::vector<PeerRecord>& peers, int64_t round, const Member& me,
              const std::map<PeerKey, std::string>& said_ready, uint64_t group_key) {
  Survey s;
  // A peer that said it was ready but whose record is now past this step has closed the round in another
  // group: it is no longer here (counted, it kept a late peer waiting for a group that never came).
  std::map<PeerKey, int64_t> step_of;
  for (const auto& p : peers) step_of[p.key] = p.step;
  s.ready = {me};
  for (const auto& [key, address] : said_ready) {
    const auto at = step_of.find(key);
    if (at == step_of.end() || at->second <= round) s.ready.push_back({key, address});
  }
  bool anyone_on_round = false;
  for (const auto& p : peers) {
    // A peer one step behind is finishing the last round and about to be ready for this one.
    if (p.step + 1 == round) s.anyone_waiting = true;
    if (p.step > round) s.ahead_at = std::max(s.ahead_at, p.step);
    if (p.step != round) continue;
    anyone_on_round = true;
    // Another group's peer is neither ready for this one nor coming (Note [Groups on a grid]).
    if (said_ready.count(p.key) || p.group_key != group_key) continue;
    if (p.ready)
      s.ready.push_back({p.key, p.address});
    else
      s.anyone_waiting = true;
  }
  s.anyone_here = s.ready.size() > 1 || s.anyone_waiting || anyone_on_round;
  std::sort(s.ready.begin(), s.ready.end(), [](const Member& a, const Member& b) { return a.key < b.key; });
  return s;
}

}  // namespace

// One all-reduce's fixed facts: the round, the group, this peer's place in it and its values.
struct Averager::Round {
  uint64_t number;
  const std::vector<Member>& group;
  int64_t me;
  at::Tensor values;
  Codec codec;

  int64_t size() const { return static_cast<int64_t>(group.size()); }
  const Member& member(int64_t j) const { return group[static_cast<size_t>(j)]; }
  // Member j's part of `t` (values, or a tensor of its shape), on the codec's block boundaries.
  at::Tensor part(const at::Tensor& t, int64_t j) const {
    const auto [b, e] = part_bounds(values.numel(), size(), j, codec_alignment(codec));
    return t.slice(0, b, e);
  }
};

RoundOutcome Averager::all_reduce(uint64_t round, const std::vector<Member>& group, const at::Tensor& flat,
                                  double weight) {
  const auto start = Clock::now();
  RoundOutcome out;
  out.group = group;
  const auto mine_it =
      std::find_if(group.begin(), group.end(), [&](const Member& m) { return m.key == transport_.key(); });
  COHORT_ASSERT(mine_it != group.end(), "all_reduce: this peer is not in the group");
  const Round r{round, group, mine_it - group.begin(), flat.contiguous(), options_.codec};
  decline_other_groups(round, group);
  if (r.size() == 1) {
    out.averaged = r.values;
    return out;
  }
  // Every other member's part goes to it.
  for (int64_t j = 0; j < r.size(); ++j)
    if (j != r.me)
      transport_.send(r.member(j).key, r.member(j).address, {MessageKind::kPart, round, j},
                      encode_values(weight, r.part(r.values, j), r.codec));
  if (options_.fault_round == static_cast<int64_t>(round) && options_.fault_signal != 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // let the frames leave first
    ::raise(options_.fault_signal);
  }
  out.averaged = r.values.clone();
  // This member reduces its own part from what arrives by half the timeout (Note [What a round does when a peer
  // fails]).
  const auto missing = reduce_own_part(r, weight, after(start, options_.averaging_timeout_s / 2), out);
  const auto lost = receive_results(r, after(start, options_.averaging_timeout_s), out);
  out.averaging_s = seconds_since(start);
  const auto names = [](const std::vector<std::string>& v) {
    std::string s;
    for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
    return s;
  };
  // Silent: neither a contribution nor a result from it; a member that joined another group is not.
  for (const auto* names_of : {&missing, &lost})
    for (const auto& name : *names_of)
      if (name.find(" (") == std::string::npos &&
          std::find(out.silent.begin(), out.silent.end(), name) == out.silent.end())
        out.silent.push_back(name);
  if (!missing.empty())
    out.problem = "no contribution from " + names(missing) + " within " +
                  std::to_string(options_.averaging_timeout_s / 2) + " s: averaged over " +
                  std::to_string(out.contributions) + " of " + std::to_string(r.size());
  if (!lost.empty())
    out.problem += std::string(out.problem.empty() ? "" : "; ") + "no result from " + names(lost) +
                   ": their part(s) kept this peer's own values";
  return out;
}

// Note [A peer in two groups declines the other]
// Two peers can both think they lead a key's round (each saw the other ready too late) and send groups
// that share members. A member joins the first group it hears of; the second group's members would
// wait for its contribution and its part until swarm.averaging_timeout_s (seen: 30 s rounds at start,
// after which the rest of the swarm had finished). With swarm.group_size the two leaders' groups differ
// entirely (each shuffles and splits its own view), so this is no longer rare. So a member that hears of
// another group for a round it is in declines it at once: to each member of that group that is not in its
// own, it sends a contribution and a result of weight 0, which arrive as malformed: that member leaves
// it out at once instead of waiting (Note [What a round does when a peer fails]).
void Averager::decline_late_groups() {
  for (const auto& [round, group] : recent_) decline_other_groups(round, group);
}

void Averager::decline_other_groups(uint64_t round, const std::vector<Member>& mine) {
  const auto first_place = first_place_;  // group_from sets it; this peer's group's is the one to keep
  while (auto m = transport_.receive({MessageKind::kGroup, round, 0}, Clock::now())) {
    const auto other = group_from(*m);
    if (!other) continue;
    const auto in_mine = [&](const Member& x) {
      return std::any_of(mine.begin(), mine.end(), [&](const Member& y) { return y.key == x.key; });
    };
    int64_t me = 0;
    for (size_t j = 0; j < other->size(); ++j)
      if ((*other)[j].key == transport_.key()) me = static_cast<int64_t>(j);
    Writer w;
    w.f64(0.0);
    const auto none = w.take();
    for (size_t j = 0; j < other->size(); ++j) {
      const auto& x = (*other)[j];
      if (x.key == transport_.key() || in_mine(x)) continue;
      transport_.send(x.key, x.address, {MessageKind::kPart, round, static_cast<int64_t>(j)}, none);
      transport_.send(x.key, x.address, {MessageKind::kResult, round, me}, none);
    }
  }
  first_place_ = first_place;
}

// A message of round `r` from `from` by `by`, declining other groups of the round meanwhile (Note [A peer
// in two groups declines the other]): the members of another group wait on this peer while it waits.
std::optional<Message> Averager::receive_in_round(const Round& r, Topic topic, Clock::time_point by,
                                                  const PeerKey& from) {
  for (;;) {
    const auto slice = std::min(by, after(Clock::now(), 0.05));
    if (auto m = transport_.receive(topic, slice, from)) return m;
    decline_other_groups(r.number, r.group);
    decline_late_groups();
    if (Clock::now() >= by) return std::nullopt;
  }
}

// Averages this member's own part over the contributions that arrived by `by`, puts it into
// out.averaged and sends it to every other member. Returns the members whose contribution is missing.
std::vector<std::string> Averager::reduce_own_part(const Round& r, double weight, Clock::time_point by,
                                                   RoundOutcome& out) {
  const auto part_numel = r.part(r.values, r.me).numel();
  std::vector<at::Tensor> parts;
  std::vector<double> weights;
  std::vector<std::string> missing;
  for (int64_t k = 0; k < r.size(); ++k) {
    if (k == r.me) {
      // What another member would decode of this peer's part, so every member's result has the same
      // bits (and a sender's error feedback sees exactly what the wire lost).
      parts.push_back(roundtrip(r.part(r.values, r.me), r.codec));
      weights.push_back(weight);
      continue;
    }
    const auto m = receive_in_round(r, {MessageKind::kPart, r.number, r.me}, by, r.member(k).key);
    const auto decoded = m ? decode_values(m->body, part_numel, r.codec) : std::nullopt;
    if (!decoded) {
      missing.push_back(peer_name(r.member(k).key) + (m && declined(*m) ? " (it joined another group)" : ""));
      continue;
    }
    parts.push_back(decoded->second);
    weights.push_back(decoded->first);
  }
  out.contributions = static_cast<int64_t>(parts.size());
  double total = 0;
  for (double w : weights) total += w;
  const auto result = encode_values(total, weighted_mean(parts, weights), r.codec);
  const auto reduced = decode_values(result, part_numel, r.codec);  // as the others decode it
  if (!reduced) {
    // Only this peer's own contribution can be non-finite (the others' were checked on arrival): it
    // keeps its values, and its step finds the inf or NaN. The others keep theirs for this part.
    out.problem = "this peer's contribution is not finite";
    return missing;
  }
  for (int64_t j = 0; j < r.size(); ++j)
    if (j != r.me)
      transport_.send(r.member(j).key, r.member(j).address, {MessageKind::kResult, r.number, r.me}, result);
  r.part(out.averaged, r.me).copy_(reduced->second);
  return missing;
}

// Puts every other member's averaged part that arrives by `by` into out.averaged; a part that does not
// keeps this peer's own values. Returns the members whose result is missing.
std::vector<std::string> Averager::receive_results(const Round& r, Clock::time_point by, RoundOutcome& out) {
  std::vector<std::string> lost;
  for (int64_t j = 0; j < r.size(); ++j) {
    if (j == r.me) continue;
    const auto m = receive_in_round(r, {MessageKind::kResult, r.number, j}, by, r.member(j).key);
    const auto decoded = m ? decode_values(m->body, r.part(r.values, j).numel(), r.codec) : std::nullopt;
    if (decoded) {
      r.part(out.averaged, j).copy_(decoded->second);
    } else {
      ++out.parts_local;
      lost.push_back(peer_name(r.member(j).key) + (m && declined(*m) ? " (it joined another group)" : ""));
    }
  }
  return lost;
}

}  // namespace cohort::p2p

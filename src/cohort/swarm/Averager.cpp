#include "cohort/swarm/Averager.h"

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstring>
#include <map>
#include <thread>

#include "cohort/swarm/Wire.h"
#include "cohort/util/Error.h"

namespace cohort::swarm {

namespace {

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
Clock::time_point after(Clock::time_point t, double seconds) {
  return t + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

std::vector<uint8_t> encode_values(double weight, const at::Tensor& values, Codec codec) {
  Writer w;
  const auto bytes = encode(values, codec);
  w.f64(weight).raw(bytes.data(), bytes.size());
  return w.take();
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
              const std::map<PeerKey, std::string>& said_ready);

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
  const auto group = match(round, std::move(mine), problem);
  const double matchmaking = seconds_since(start);
  auto out = all_reduce(round, group, flat, weight);
  out.matchmaking_s = matchmaking;
  if (out.problem.empty()) out.problem = problem;
  transport_.forget_before(round + 1);
  return out;
}

void Averager::send_group(uint64_t round, const std::vector<Member>& group) {
  Writer w;
  w.u64(group.size());
  for (const auto& m : group) w.raw(m.key.data(), m.key.size()).str(m.address);
  const auto body = w.take();
  for (const auto& m : group)
    if (m.key != transport_.key()) transport_.send(m.key, m.address, {MessageKind::kGroup, round, 0}, body);
}

std::optional<std::vector<Member>> Averager::group_from(const Message& m) const {
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
  const Member me = say_ready(round, std::move(mine));
  std::map<PeerKey, std::string> said_ready;  // by message
  for (;;) {
    hear_ready(round, said_ready);
    const auto peers = directory_.peers();
    const auto s = survey(peers, static_cast<int64_t>(round), me, said_ready);
    // Note [A straggler does not wait for a group]: every other live peer is past this step (they closed
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
      send_group(round, s.ready);
      return s.ready;
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
  hello.str(me.address);
  const auto body = hello.take();
  for (const auto& p : directory_.peers())
    if (p.step == static_cast<int64_t>(round)) transport_.send(p.key, p.address, {MessageKind::kReady, round, 0}, body);
  return me;
}

void Averager::hear_ready(uint64_t round, std::map<PeerKey, std::string>& said_ready) {
  while (auto m = transport_.receive({MessageKind::kReady, round, 0}, Clock::now())) {
    Reader r(m->body);
    const auto address = r.str();
    if (r.ok()) said_ready[m->sender] = address;
  }
}

namespace {

Survey survey(const std::vector<PeerRecord>& peers, int64_t round, const Member& me,
              const std::map<PeerKey, std::string>& said_ready) {
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
    if (said_ready.count(p.key)) continue;
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
  // This member reduces its own part from what arrives by half the timeout (Note [What a round does...]).
  const auto missing = reduce_own_part(r, weight, after(start, options_.averaging_timeout_s / 2), out);
  const auto lost = receive_results(r, after(start, options_.averaging_timeout_s), out);
  out.averaging_s = seconds_since(start);
  const auto names = [](const std::vector<std::string>& v) {
    std::string s;
    for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
    return s;
  };
  if (!missing.empty())
    out.problem = "no contribution from " + names(missing) + " within " +
                  std::to_string(options_.averaging_timeout_s / 2) + " s: averaged over " +
                  std::to_string(out.contributions) + " of " + std::to_string(r.size());
  if (!lost.empty())
    out.problem += std::string(out.problem.empty() ? "" : "; ") + "no result from " + names(lost) +
                   ": their part(s) kept this peer's own values";
  return out;
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
    const auto m = transport_.receive({MessageKind::kPart, r.number, r.me}, by, r.member(k).key);
    const auto decoded = m ? decode_values(m->body, part_numel, r.codec) : std::nullopt;
    if (!decoded) {
      missing.push_back(peer_name(r.member(k).key));
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
    const auto m = transport_.receive({MessageKind::kResult, r.number, j}, by, r.member(j).key);
    const auto decoded = m ? decode_values(m->body, r.part(r.values, j).numel(), r.codec) : std::nullopt;
    if (decoded) {
      r.part(out.averaged, j).copy_(decoded->second);
    } else {
      ++out.parts_local;
      lost.push_back(peer_name(r.member(j).key));
    }
  }
  return lost;
}

}  // namespace cohort::swarm

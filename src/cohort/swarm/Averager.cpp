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
  // Note [Leaving a swarm] (train/Trainer.cpp): a peer told to stop before it said it was ready withdraws:
  // its record says it is leaving, so nobody counts on it. Once it has said it is ready it stays for the
  // round: a leader may already have sent a group naming it, and a member that vanished then would cost
  // the others the averaging timeout and leave them apart (each keeps its own values for its part).
  if (options_.leaving && options_.leaving()) {
    mine.step = static_cast<int64_t>(round);
    mine.ready = false;
    mine.leaving = true;
    mine.address = transport_.address();
    directory_.announce(mine);
    problem = "leaving: no group for this step";
    return {{transport_.key(), transport_.address()}};
  }
  const auto start = Clock::now();
  const auto decide_at = after(start, options_.matchmaking_s);
  const auto give_up_at = after(start, 2 * options_.matchmaking_s + 1.0);
  mine.step = static_cast<int64_t>(round);
  mine.ready = true;
  mine.address = transport_.address();
  directory_.announce(mine);
  const Member me{transport_.key(), transport_.address()};
  // Readiness goes to the peers on this step directly too: a DHT record takes 0.1 to 1 s to be read.
  Writer hello;
  hello.str(me.address);
  const auto hello_body = hello.take();
  for (const auto& p : directory_.peers())
    if (p.step == static_cast<int64_t>(round))
      transport_.send(p.key, p.address, {MessageKind::kReady, round, 0}, hello_body);
  std::map<PeerKey, std::string> said_ready;  // by message
  for (;;) {
    while (auto m = transport_.receive({MessageKind::kReady, round, 0}, Clock::now())) {
      Reader r(m->body);
      const auto address = r.str();
      if (r.ok()) said_ready[m->sender] = address;
    }
    const auto peers = directory_.peers();
    // A peer that said it was ready but whose record is now past this step has closed the round in another
    // group: it is no longer here (counted, it kept a late peer waiting for a group that never came).
    std::map<PeerKey, int64_t> step_of;
    for (const auto& p : peers) step_of[p.key] = p.step;
    std::vector<Member> ready = {me};
    for (const auto& [key, address] : said_ready) {
      const auto at = step_of.find(key);
      if (at == step_of.end() || at->second <= static_cast<int64_t>(round)) ready.push_back({key, address});
    }
    bool anyone_waiting = false;
    for (const auto& p : peers) {
      // A peer one step behind is finishing the last round and about to be ready for this one.
      if (p.step + 1 == static_cast<int64_t>(round)) anyone_waiting = true;
      if (p.step != static_cast<int64_t>(round) || said_ready.count(p.key)) continue;
      if (p.ready)
        ready.push_back({p.key, p.address});
      else
        anyone_waiting = true;
    }
    std::sort(ready.begin(), ready.end(), [](const Member& a, const Member& b) { return a.key < b.key; });
    // Note [A straggler does not wait for a group]: every other live peer is past this step (they closed
    // its round without this peer, which came late: a newcomer whose download landed a step behind, a slow
    // or frozen peer). Nobody can join it any more, so it takes this step alone at once, and its next
    // catch_up downloads their state (Note [A peer that fell out of a round resynchronizes] in
    // parallel/swarm/SwarmPeer.cpp), instead of waiting out swarm.matchmaking_s while they move on.
    int64_t ahead_at = -1;
    bool anyone_here = ready.size() > 1 || anyone_waiting;
    for (const auto& p : peers) {
      if (p.step > static_cast<int64_t>(round)) ahead_at = std::max(ahead_at, p.step);
      if (p.step == static_cast<int64_t>(round)) anyone_here = true;
    }
    if (!anyone_here && ahead_at >= 0) {
      problem = "the other peers are past this step (at step " + std::to_string(ahead_at) + "): this step alone";
      return {me};
    }
    // Nobody else alive and no group required: a group of one at once (a lone peer trains as plain
    // training does). With swarm.min_group_size above 1 a lone peer waits for company as Hivemind's does.
    if (peers.empty() && options_.min_group_size <= 1) return {me};
    const bool leading = ready.front().key == me.key;
    const bool enough = static_cast<int64_t>(ready.size()) >= options_.min_group_size;
    if (leading && ((!anyone_waiting && enough) || Clock::now() >= decide_at)) {
      if (!enough) {
        problem = "only " + std::to_string(ready.size()) + " peer(s) ready after " +
                  std::to_string(options_.matchmaking_s) + " s (swarm.min_group_size " +
                  std::to_string(options_.min_group_size) + ")";
        return {me};
      }
      send_group(round, ready);
      return ready;
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

RoundOutcome Averager::all_reduce(uint64_t round, const std::vector<Member>& group, const at::Tensor& flat,
                                  double weight) {
  const auto start = Clock::now();
  RoundOutcome out;
  out.group = group;
  const auto n = static_cast<int64_t>(group.size());
  const auto mine_it =
      std::find_if(group.begin(), group.end(), [&](const Member& m) { return m.key == transport_.key(); });
  COHORT_ASSERT(mine_it != group.end(), "all_reduce: this peer is not in the group");
  const int64_t i = mine_it - group.begin();
  const auto codec = options_.codec;
  const auto values = flat.contiguous();
  if (n == 1) {
    out.averaged = values;
    return out;
  }
  const int64_t numel = values.numel();
  const auto slice = [&](const at::Tensor& t, int64_t j) {
    const auto [b, e] = part_bounds(numel, n, j, codec_alignment(codec));
    return t.slice(0, b, e);
  };
  // Every other member's part goes to it.
  for (int64_t j = 0; j < n; ++j)
    if (j != i)
      transport_.send(group[static_cast<size_t>(j)].key, group[static_cast<size_t>(j)].address,
                      {MessageKind::kPart, round, j}, encode_values(weight, slice(values, j), codec));
  if (options_.fault_round == static_cast<int64_t>(round) && options_.fault_signal != 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // let the frames leave first
    ::raise(options_.fault_signal);
  }
  // This member reduces its own part from what arrives by half the timeout (Note [What a round does...]).
  const auto reduce_by = after(start, options_.averaging_timeout_s / 2);
  const auto part_numel = slice(values, i).numel();
  std::vector<at::Tensor> parts;
  std::vector<double> weights;
  std::vector<std::string> missing;
  for (int64_t k = 0; k < n; ++k) {
    if (k == i) {
      // What another member would decode of this peer's part, so every member's result has the same
      // bits (and a sender's error feedback sees exactly what the wire lost).
      parts.push_back(roundtrip(slice(values, i), codec));
      weights.push_back(weight);
      continue;
    }
    const auto& member = group[static_cast<size_t>(k)];
    const auto m = transport_.receive({MessageKind::kPart, round, i}, reduce_by, member.key);
    const auto decoded = m ? decode_values(m->body, part_numel, codec) : std::nullopt;
    if (!decoded) {
      missing.push_back(peer_name(member.key));
      continue;
    }
    parts.push_back(decoded->second);
    weights.push_back(decoded->first);
  }
  out.contributions = static_cast<int64_t>(parts.size());
  double total = 0;
  for (double w : weights) total += w;
  const auto result = encode_values(total, weighted_mean(parts, weights), codec);
  const auto reduced = decode_values(result, part_numel, codec);  // as the others decode it
  out.averaged = values.clone();
  if (reduced) {
    for (int64_t j = 0; j < n; ++j)
      if (j != i)
        transport_.send(group[static_cast<size_t>(j)].key, group[static_cast<size_t>(j)].address,
                        {MessageKind::kResult, round, i}, result);
    slice(out.averaged, i).copy_(reduced->second);
  } else {
    // Only this peer's own contribution can be non-finite (the others' were checked on arrival): it
    // keeps its values, and its step finds the inf or NaN. The others keep theirs for this part.
    out.problem = "this peer's contribution is not finite";
  }
  const auto done_by = after(start, options_.averaging_timeout_s);
  std::vector<std::string> lost;
  for (int64_t j = 0; j < n; ++j) {
    if (j == i) continue;
    const auto& member = group[static_cast<size_t>(j)];
    const auto m = transport_.receive({MessageKind::kResult, round, j}, done_by, member.key);
    const auto decoded = m ? decode_values(m->body, slice(values, j).numel(), codec) : std::nullopt;
    if (decoded) {
      slice(out.averaged, j).copy_(decoded->second);
    } else {
      ++out.parts_local;
      lost.push_back(peer_name(member.key));
    }
  }
  out.averaging_s = seconds_since(start);
  const auto names = [](const std::vector<std::string>& v) {
    std::string s;
    for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
    return s;
  };
  if (!missing.empty())
    out.problem = "no contribution from " + names(missing) + " within " +
                  std::to_string(options_.averaging_timeout_s / 2) + " s: averaged over " +
                  std::to_string(out.contributions) + " of " + std::to_string(n);
  if (!lost.empty())
    out.problem += std::string(out.problem.empty() ? "" : "; ") + "no result from " + names(lost) +
                   ": their part(s) kept this peer's own values";
  return out;
}

}  // namespace cohort::swarm

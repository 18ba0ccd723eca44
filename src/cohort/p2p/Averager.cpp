// The butterfly all-reduce of a group that matchmaking formed (Matchmaking.cpp): each member reduces one
// part of the vector, weighted by the samples behind each contribution, and sends it back; a member that
// fails costs the others at most the averaging timeout (Note [What a round does when a peer fails] in
// p2p/Averager.h), and a member asked into two groups declines the other.
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

// A contribution or a result decoded into `into`: its weight (positive), or nullopt when malformed (a
// weight that is not, or not exactly `into`'s count of finite values).
std::optional<double> decode_weighted(const std::vector<uint8_t>& body, const at::Tensor& into, Codec codec) {
  Reader r(body);
  const double weight = r.f64();
  if (!r.ok() || !(weight > 0) || !std::isfinite(weight)) return std::nullopt;
  const size_t left = r.left();
  if (!decode_into(r.take(left), left, into, codec)) return std::nullopt;
  return weight;
}

// The topic's part of piece `q` of part `j`: piece 0 is the part's own topic, where a whole part and a
// decline go too (Note [A part travels in pieces]).
int64_t piece_topic(int64_t j, int64_t q) { return j + (q << 32); }

}  // namespace

// Note [A part travels in pieces]
// A part went as one frame: its sender encoded and sealed all of it before the first byte left, and its
// receiver opened and decoded all of it after the last arrived, so a round took the wire's time plus
// the software's, one after the other (2 machines at 1 Gbit/s: 0.47 s for 0.38 s of wire,
// docs/scaling.md). Now a part of more than kPieceBytes on the wire goes in up to kMaxPieces pieces, each
// a frame with the weight and its own values, so that one piece is sealed while the last is on the wire
// and decoded while the next one is (as Gloo's reduce-scatter goes in pieces on LibTorch 1.13: Note
// [Reduce-scatter and all-gather in pieces on LibTorch 1.13]). Pieces start on the codec's blocks, so
// they hold exactly the part's bytes, and the sum is taken over whole parts as before, so the bits do not
// change. A receiver tells a whole part from a first piece by its size; a sender sends pieces only to the
// peers whose record says they read them (PeerRecord::kPartPieces), and whole parts to peers of an
// earlier release. The bit names this rule (kPieceBytes, kMaxPieces): a release that changes them takes a
// new bit, or its pieces would not fit the bounds an earlier reader expects. A contribution or a result counts only
// when every piece of it arrived (Note [What a round does when a peer fails]).
int64_t piece_count(int64_t numel, Codec codec) {
  return std::clamp<int64_t>((encoded_bytes(numel, codec) + kPieceBytes - 1) / kPieceBytes, 1, kMaxPieces);
}

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
  said_ = {};
  round_ = round;
  claimed_twice_ = false;
  const auto group = match(round, std::move(mine), problem);
  const double matchmaking = seconds_since(start);
  auto out = all_reduce(round, group, flat, weight);
  recent_.emplace_back(round, group);
  while (recent_.size() > kRecentRounds) recent_.pop_front();
  decline_late_groups();
  out.matchmaking_s = matchmaking;
  for (size_t j = 0; j < group.size(); ++j)
    if (group[j].key == transport_.key()) out.place = static_cast<int64_t>(said_.first + j);
  out.keys = group.size() > 1 ? said_.keys : 0;
  out.swarm = group.size() > 1 ? said_.swarm : 0;
  out.moved = group.size() > 1 ? said_.moved : -1;
  out.claimed_twice = claimed_twice_;
  if (out.problem.empty()) out.problem = problem;
  // Late groups of the last rounds are declined while the next ones run (decline_late_groups), then
  // forgotten.
  transport_.forget_before(round + 1 >= kRecentRounds ? round + 1 - kRecentRounds : 0);
  return out;
}

// One all-reduce's fixed facts: the round, the group, this peer's place in it and its values.
struct Averager::Round {
  uint64_t number;
  const std::vector<Member>& group;
  int64_t me;
  at::Tensor values;
  Codec codec;

  std::vector<bool> reads_pieces;  // by member: its record says it reads parts in pieces

  int64_t size() const { return static_cast<int64_t>(group.size()); }
  // The pieces a part of `numel` elements goes to member j in.
  int64_t pieces_to(int64_t j, int64_t numel) const {
    return reads_pieces[static_cast<size_t>(j)] ? piece_count(numel, codec) : 1;
  }
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
  // Weights (a parameter round) go in fp32, whatever the gradients' codec: rounded to fp16 or int8 at every
  // averaging, updates smaller than the rounding would be lost for good, with no error feedback to carry
  // them (hivemind's state averaging is uncompressed by default too).
  const Codec codec = (round & kParametersRound) ? Codec::kNone : options_.codec;
  Round r{round, group, mine_it - group.begin(), flat.contiguous(), codec, std::vector<bool>(group.size())};
  decline_other_groups(round, group);
  if (r.size() == 1) {
    out.averaged = r.values;
    return out;
  }
  if (options_.send_pieces)
    for (const auto& p : directory_.peers())
      for (size_t j = 0; j < group.size(); ++j)
        if (group[j].key == p.key) r.reads_pieces[j] = (p.features & PeerRecord::kPartPieces) != 0;
  send_contributions(r, weight);
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
  // group_from sets it; this peer's own group's is the one to keep
  const auto said = said_;
  while (auto m = transport_.receive({MessageKind::kGroup, round, 0}, Clock::now())) {
    const auto other = group_from(*m);
    if (!other) continue;
    if (round == round_) claimed_twice_ = true;
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
  said_ = said;
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

// Member `from`'s message of `kind` about part `j` (Note [A part travels in pieces]): whole, or piece
// 0 on the part's own topic and the rest after it.
std::optional<double> Averager::receive_part(const Round& r, MessageKind kind, int64_t j, int64_t from,
                                             Clock::time_point by, const at::Tensor& into, bool& declined_out) {
  const auto& key = r.member(from).key;
  auto first = receive_in_round(r, {kind, r.number, j}, by, key);
  if (!first) return std::nullopt;
  if (declined(*first)) {
    declined_out = true;
    return std::nullopt;
  }
  if (auto weight = decode_weighted(first->body, into, r.codec)) return weight;
  const int64_t n = piece_count(into.numel(), r.codec);
  std::optional<double> weight;
  for (int64_t q = 0; q < n; ++q) {
    const auto [b, e] = part_bounds(into.numel(), n, q, codec_alignment(r.codec));
    std::optional<Message> m;
    if (q == 0)
      m = std::move(first);
    else
      m = receive_in_round(r, {kind, r.number, piece_topic(j, q)}, by, key);
    const auto w = m ? decode_weighted(m->body, into.slice(0, b, e), r.codec) : std::nullopt;
    if (!w || (weight && *w != *weight)) return std::nullopt;
    weight = w;
  }
  return weight;
}

void Averager::send_contributions(const Round& r, double weight) {
  int64_t most = 1;
  for (int64_t j = 0; j < r.size(); ++j) most = std::max(most, r.pieces_to(j, r.part(r.values, j).numel()));
  for (int64_t q = 0; q < most; ++q)
    for (int64_t j = 0; j < r.size(); ++j) {
      const auto part = r.part(r.values, j);
      const int64_t n = r.pieces_to(j, part.numel());
      if (j == r.me || q >= n) continue;
      const auto [b, e] = part_bounds(part.numel(), n, q, codec_alignment(r.codec));
      transport_.send(r.member(j).key, r.member(j).address, {MessageKind::kPart, r.number, piece_topic(j, q)},
                      encode_values(weight, part.slice(0, b, e), r.codec));
    }
}

bool Averager::send_result(const Round& r, double total, const at::Tensor& mean, const at::Tensor& mine) {
  const int64_t n = piece_count(mean.numel(), r.codec);
  bool whole_wanted = n == 1, pieces_wanted = false;
  for (int64_t j = 0; j < r.size(); ++j) {
    if (j == r.me) continue;
    if (r.pieces_to(j, mean.numel()) == 1)
      whole_wanted = true;
    else
      pieces_wanted = true;
  }
  if (whole_wanted) {
    const auto whole = encode_values(total, mean, r.codec);
    if (!decode_weighted(whole, mine, r.codec)) return false;
    for (int64_t j = 0; j < r.size(); ++j)
      if (j != r.me && r.pieces_to(j, mean.numel()) == 1)
        transport_.send(r.member(j).key, r.member(j).address, {MessageKind::kResult, r.number, r.me}, whole);
  }
  for (int64_t q = 0; pieces_wanted && q < n; ++q) {
    const auto [b, e] = part_bounds(mean.numel(), n, q, codec_alignment(r.codec));
    const auto piece = encode_values(total, mean.slice(0, b, e), r.codec);  // once, for every member that reads pieces
    if (!whole_wanted && !decode_weighted(piece, mine.slice(0, b, e), r.codec)) return false;
    for (int64_t j = 0; j < r.size(); ++j)
      if (j != r.me && r.pieces_to(j, mean.numel()) > 1)
        transport_.send(r.member(j).key, r.member(j).address, {MessageKind::kResult, r.number, piece_topic(r.me, q)},
                        piece);
  }
  return true;
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
    auto into = at::empty({part_numel}, at::kFloat);
    bool declined_it = false;
    const auto w = receive_part(r, MessageKind::kPart, r.me, k, by, into, declined_it);
    if (!w) {
      missing.push_back(peer_name(r.member(k).key) + (declined_it ? " (it joined another group)" : ""));
      continue;
    }
    parts.push_back(into);
    weights.push_back(*w);
  }
  out.contributions = static_cast<int64_t>(parts.size());
  double total = 0;
  for (double w : weights) total += w;
  const auto mean = weighted_mean(parts, weights);
  // Only this peer's own contribution can be non-finite (the others' were checked on arrival): it keeps
  // its values, and its step finds the inf or NaN. Nothing is sent, so the others keep theirs for this
  // part. (A finite mean encodes finite: fp16 clamps, and an int8 scale is finite when its values are.)
  const auto mine = r.part(out.averaged, r.me);
  if (!at::isfinite(mean).all().item<bool>() || !send_result(r, total, mean, mine)) {
    mine.copy_(r.part(r.values, r.me));
    out.problem = "this peer's contribution is not finite";
  }
  return missing;
}

// Puts every other member's averaged part that arrives by `by` into out.averaged; a part that does not
// (or does in part) keeps this peer's own values. Returns the members whose result is missing.
std::vector<std::string> Averager::receive_results(const Round& r, Clock::time_point by, RoundOutcome& out) {
  std::vector<std::string> lost;
  for (int64_t j = 0; j < r.size(); ++j) {
    if (j == r.me) continue;
    const auto into = r.part(out.averaged, j);
    bool declined_it = false;
    if (!receive_part(r, MessageKind::kResult, j, j, by, into, declined_it)) {
      into.copy_(r.part(r.values, j));
      ++out.parts_local;
      lost.push_back(peer_name(r.member(j).key) + (declined_it ? " (it joined another group)" : ""));
    }
  }
  return lost;
}

}  // namespace cohort::p2p

// One averaging round of the swarm, as Hivemind's averager does it: matchmaking (the ready peers form a
// group around a leader, within swarm.matchmaking_s) and a butterfly all-reduce in which each member
// reduces one part of the vector, weighted by the samples behind each contribution, and sends it back.
//
//   p2p::Averager averager(transport, directory, {.matchmaking_s = 5, .averaging_timeout_s = 30});
//   auto out = averager.average(step, flat_gradient, samples, my_record);
//   // out.averaged: the group's weighted mean where it arrived, this peer's own values elsewhere
//
// Matchmaking is defined in p2p/Matchmaking.cpp, the all-reduce in p2p/Averager.cpp.
//
// Note [What a round does when a peer fails]
// A member that dies, freezes or loses its link mid-round is never waited for past the deadline: the
// member reducing a part averages the contributions that arrived by half of swarm.averaging_timeout and
// sends that back; a part whose reducer does not answer by the timeout keeps this peer's own values (a
// local update for that part). Either way the round ends within the timeout, every part is finite, and
// the outcome says what happened so the log can.
#pragma once

#include <deque>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "cohort/p2p/Codec.h"
#include "cohort/p2p/Directory.h"
#include "cohort/p2p/Transport.h"

namespace cohort::p2p {

struct Member {
  PeerKey key{};
  std::string address;
};

// The element range [begin, end) of part `j` of `numel` elements split among `n` members: contiguous,
// in member order, starting on multiples of `align` (the codec's block), sizes differing by at most one
// block. Pure, the same on every member.
std::pair<int64_t, int64_t> part_bounds(int64_t numel, int64_t n, int64_t j, int64_t align = 1);
// How many pieces a part of `numel` elements travels in to a peer that reads pieces (Note [A part travels
// in pieces]): one up to kPieceBytes on the wire, at most kMaxPieces. Pure, the same on every member.
constexpr int64_t kPieceBytes = int64_t{1} << 20;
constexpr int64_t kMaxPieces = 8;
int64_t piece_count(int64_t numel, Codec codec);
// How many groups `ready` peers of one key form with swarm.group_size `group_size` > 0 (Note [Groups on a
// grid]): ceil(ready / group_size), fewer where the smallest would hold one peer or fewer than
// `min_group_size`.
int64_t group_count(int64_t ready, int64_t group_size, int64_t min_group_size);
// How many keys a grid dimension has for `known` peers (this one included) in groups of `group_size`:
// round(known / group_size), at most known / 2, at least 1 (Note [Groups on a grid]).
int64_t grid_keys(int64_t known, int64_t group_size);
// The group key a member of key `key` goes to after round `round`, from its `place` among the round's
// ready peers of its key, on a grid of `keys` keys a dimension (Note [Groups on a grid]). Never 0.
uint64_t next_group_key(uint64_t key, uint64_t round, int64_t place, int64_t keys);
// Note [An overfull key splits]: a round of `ready` peers on one key whose coordinates stay, in groups of
// at most `group_size`, on a dimension of `along` keys as its leader sees them (grid_keys_along; 0: none
// move); `fewest`: the fewest that split off to a key of their own.
struct Split {
  int64_t along = 0, ready = 0, group_size = 0, fewest = 2;
};
// Where each of the round's ready peers, in the leader's order, moves: one past the coordinate, 0 where it
// stays. `short_keys`: the other keys of the dimension that hold fewer than a group, with their peers, as
// the leader's mates count them (PeerRecord::census).
std::vector<uint64_t> split_moves(uint64_t key, const Split& split, const std::map<uint64_t, int64_t>& short_keys);
inline constexpr uint64_t kMaxGridKeys = uint64_t{1} << 20;  // a grid dimension's keys, at most
inline constexpr uint64_t kMaxSwarm = uint64_t{1} << 24;     // a swarm's peers, at most, as a group message says

// The weighted mean of `values` (each weighted by `weights`), summed in the order given so every member
// that reduces the same contributions gets the same bits.
at::Tensor weighted_mean(const std::vector<at::Tensor>& values, const std::vector<double>& weights);

// The peers that formed a grid whose coordinates stay, by key, and its keys a side (grid_formed): where
// each of them forms. Empty until it forms.
struct Roster {
  std::vector<PeerKey> peers;  // sorted
  int64_t keys = 0;
  // The key peer `key` names at `round` once its coordinates stay, by its rank (p2p::grid_cell); nullopt
  // where it is not one of them.
  std::optional<uint64_t> key_at(const PeerKey& key, int64_t round) const;
};

struct AveragingOptions {
  double matchmaking_s = 5.0;         // how long a leader waits for more peers to become ready
  double averaging_timeout_s = 30.0;  // how long a round may take once the group is formed
  int64_t min_group_size = 2;         // fewer ready peers than this: no round, a local step
  // At most this many members per group (0: every ready peer). Only peers announcing the same group key
  // (PeerRecord::group_key) group together (Note [Groups on a grid]).
  int64_t group_size = 0;
  Codec codec = Codec::kNone;  // how contributions and results travel (p2p/Codec.h)
  // Parts go in pieces to the peers that read them (Note [A part travels in pieces] in p2p/Averager.cpp);
  // false: whole, as a release before pieces sent them (tests of a mixed swarm).
  bool send_pieces = true;
  // True once this peer is leaving (Ctrl-C): it withdraws from a round it has not yet said it is ready
  // for; a round it said it was ready for still ends (Note [Leaving a swarm] in train/Trainer.cpp).
  std::function<bool()> leaving = nullptr;
  // Called while matchmaking waits (a peer answers state requests then too: Note [A peer that fell out
  // of a round resynchronizes] in parallel/swarm/SwarmPeer.cpp).
  std::function<void()> while_waiting = nullptr;
  // Fault injection (comm/FaultInjection.h lists every fault): in round `fault_round` this peer sends
  // its contributions, then raises `fault_signal` on itself (SIGKILL: dies mid-round; SIGSTOP: freezes).
  int64_t fault_round = -1;
  int fault_signal = 0;
};

struct RoundOutcome {
  at::Tensor averaged;        // float32, flat, this peer's result
  std::vector<Member> group;  // the members, in their order (this peer alone: a local step)
  int64_t contributions = 1;  // contributions in the average of this peer's own part
  int64_t parts_local = 0;    // parts whose average did not come back (kept local)
  // This peer's place among every peer of its group key in the round, in the leader's order: its place in
  // its group plus the places of the groups before it (Note [Groups on a grid]).
  int64_t place = 0;
  // The key count of the next round's grid dimension its leader dealt with (0: a leader that did not say,
  // or no group): members take their next key from it (Note [A leader deals its groups over the next
  // round's keys]).
  int64_t keys = 0;
  // The live peers its leader knew, itself included (0: a leader that did not say, or no group): the
  // swarm the next step's target batch is counted over (Note [The target batch counted in the key and
  // scaled to the swarm] in parallel/swarm/SwarmProgress.cpp).
  int64_t swarm = 0;
  // Where its coordinates stay (PeerRecord::grid): the coordinate of this round's key dimension its leader
  // moved it to, where the key held more ready peers than a group (Note [An overfull key splits] in
  // p2p/Matchmaking.cpp); -1: it stays.
  int64_t moved = -1;
  // Another leader's group for the same round named this peer too (Note [A peer in two groups declines the
  // other]): two deals may name it, with different keys.
  bool claimed_twice = false;
  double matchmaking_s = 0, averaging_s = 0;
  std::string problem;  // what went wrong, empty when nothing did
  // The members (peer names) that sent no contribution or no result within the averaging timeout.
  std::vector<std::string> silent;
  bool with_others() const { return group.size() > 1 && parts_local < static_cast<int64_t>(group.size()) - 1; }
};

class Averager {
 public:
  Averager(Transport& transport, Directory& directory, AveragingOptions options);

  // Matchmaking and the all-reduce for the swarm's step `round`. `mine` is this peer's record, which is
  // announced as ready for `round` while the group forms.
  RoundOutcome average(uint64_t round, const at::Tensor& flat, double weight, PeerRecord mine);

  // The live peers (this one among them) whose keys' ranks placed each on a grid of `keys` keys a side as
  // it formed (Note [A grid whose coordinates stay] in parallel/swarm/SwarmGrid.cpp): a leader whose
  // coordinates stay waits for a peer still about to form only where its rank puts it on the leader's key.
  void grid_formed(std::vector<PeerKey> roster, int64_t keys);

  // The two halves, for tests. match() returns the group (this peer alone when no group formed, with
  // `problem` saying why); all_reduce() averages over a given group.
  std::vector<Member> match(uint64_t round, PeerRecord mine, std::string& problem);
  RoundOutcome all_reduce(uint64_t round, const std::vector<Member>& group, const at::Tensor& flat, double weight);

 private:
  struct Round;

  // Matchmaking (Matchmaking.cpp).
  std::vector<Member> withdraw(uint64_t round, PeerRecord mine, std::string& problem);
  Member say_ready(uint64_t round, PeerRecord mine);
  // Sends this peer's ready message to the peers on `round` with its group key not yet in `told` (Note
  // [Readiness goes to the group] in p2p/DirectorySend.cpp), and adds them there.
  void tell_ready(uint64_t round, const Member& me, uint64_t group_key, const std::vector<PeerRecord>& peers,
                  std::set<PeerKey>& told);
  void hear_ready(uint64_t round, uint64_t group_key, std::map<PeerKey, std::string>& said_ready);
  // `first`: the place of the group's first member among all the ready peers of its key, in the leader's
  // order (Note [Groups on a grid]).
  // `keys`: the next round's key count (grid_keys) it dealt with, 0 without swarm.group_size.
  // `swarm`: the live peers it knows, itself included, 0 without swarm.group_size (Note [The target batch
  // counted in the key and scaled to the swarm] in parallel/swarm/SwarmProgress.cpp).
  // `moved`: one past the coordinate each member moves to, 0 where it stays, or empty (Note [An overfull key
  // splits]).
  void send_group(uint64_t round, const std::vector<Member>& group, uint64_t first, uint64_t keys, uint64_t swarm,
                  const std::vector<uint64_t>& moved = {});
  // The leader's decision: the ready peers of its key `group_key` as one group, or, past swarm.group_size,
  // as several (each sent its own, and the deal to the other peers); returns this peer's group.
  std::vector<Member> send_groups(uint64_t round, std::vector<Member> ready, uint64_t group_key);
  // Note [An overfull key splits]: where each of `ready` peers of its key in this round moves.
  std::vector<uint64_t> plan_split(uint64_t round, uint64_t group_key, int64_t ready,
                                   const std::vector<PeerRecord>& peers) const;
  // To this peer's directory and every live peer, where the leader dealt each member of its groups (Note
  // [A leader deals its groups over the next round's keys]).
  void send_deal(uint64_t round, const std::vector<PeerRecord>& peers, const std::vector<Dealt>& dealt);
  // Whether the live peer `key` (or this one) takes its key from its leader's count (PeerRecord::kTakesDeals).
  bool takes_deals(const std::vector<PeerRecord>& peers, const PeerKey& key) const;
  // Whether the live peer `key` (or this one) keeps its grid coordinates (PeerRecord::grid): it is not dealt.
  bool keeps_coordinates(const std::vector<PeerRecord>& peers, const PeerKey& key) const;
  // The group a kGroup message names, when it is well formed and names this peer; sets said_.
  std::optional<std::vector<Member>> group_from(const Message& m);

  // The all-reduce (Averager.cpp).
  // Note [A peer in two groups declines the other]: a group for `round` other than `mine` that arrived
  // is declined to its members.
  void decline_other_groups(uint64_t round, const std::vector<Member>& mine);
  void decline_late_groups();
  std::optional<Message> receive_in_round(const Round& r, Topic topic, Clock::time_point by, const PeerKey& from);
  // Member `from`'s message of `kind` about part `j`, whole or in pieces, decoded into `into` by `by`: its
  // weight, or nullopt when a piece is missing or malformed or the member declined (`declined_out`).
  std::optional<double> receive_part(const Round& r, MessageKind kind, int64_t j, int64_t from, Clock::time_point by,
                                     const at::Tensor& into, bool& declined_out);
  // Each other member's part of this peer's values, piece q to every member before piece q + 1 to any.
  void send_contributions(const Round& r, double weight);
  // This peer's reduced part, `mean`, to every other member: whole to those that read no pieces, in pieces
  // to the others, each encoding made once; `mine` gets what they decode (the same bits). False when that
  // decode fails.
  bool send_result(const Round& r, double total, const at::Tensor& mean, const at::Tensor& mine);
  std::vector<std::string> reduce_own_part(const Round& r, double weight, Clock::time_point by, RoundOutcome& out);
  std::vector<std::string> receive_results(const Round& r, Clock::time_point by, RoundOutcome& out);

  Transport& transport_;
  Directory& directory_;
  AveragingOptions options_;
  // What this peer's last group message said besides its members (send_group's arguments).
  struct Said {
    uint64_t first = 0;
    int64_t keys = 0;
    int64_t swarm = 0;
    int64_t moved = -1;
  } said_;
  PeerRecord mine_;             // this peer's record as the round's matchmaking announced it
  Roster roster_;               // grid_formed's (none before)
  uint64_t round_ = 0;          // the round average() is in
  bool claimed_twice_ = false;  // a group of round_ other than this peer's came (decline_other_groups)
  // The last rounds this peer averaged in, with its group in each: a group of one of them that arrives
  // late is declined (Note [A peer in two groups declines the other]).
  static constexpr size_t kRecentRounds = 4;
  std::deque<std::pair<uint64_t, std::vector<Member>>> recent_;
};

}  // namespace cohort::p2p

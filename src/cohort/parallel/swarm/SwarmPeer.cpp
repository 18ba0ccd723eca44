#include "cohort/parallel/swarm/SwarmPeer.h"

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <iostream>
#include <map>
#include <sstream>

#include "cohort/p2p/Averager.h"
#include "cohort/p2p/Directory.h"
#include "cohort/p2p/Transport.h"
#include "cohort/util/Error.h"
#include "cohort/util/StopSignal.h"

namespace cohort::parallel::swarm {

namespace {

std::vector<std::string> split_peers(const std::string& list) {
  std::vector<std::string> out;
  std::stringstream ss(list);
  for (std::string item; std::getline(ss, item, ',');) {
    const auto b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
    if (b != std::string::npos) out.push_back(item.substr(b, e - b + 1));
  }
  return out;
}

}  // namespace

p2p::PeerIdentity identity_from_config(const SwarmConfig& cfg) {
  if (cfg.insecure) return p2p::issue_token(p2p::insecure_run_key(), std::chrono::hours(24 * 365), std::time(nullptr));
  if (cfg.token.empty())
    throw ConfigError("dist.strategy=swarm needs swarm.token: the swarm is authenticated by default",
                      "make a run key and a token for this peer: cohort swarm keygen --out run.key; cohort swarm "
                      "token --key run.key --ttl 24h --out peer.token; then pass swarm.token=peer.token (or "
                      "swarm.insecure=true on a network you trust)");
  auto identity = p2p::load_identity(cfg.token);
  if (auto why = p2p::check_token(identity.token, identity.token.run_public_key, std::time(nullptr)); !why.empty())
    throw ConfigError("swarm.token=" + cfg.token + ": " + why,
                      "issue a new token: cohort swarm token --key run.key --ttl 24h --out peer.token");
  return identity;
}

std::vector<p2p::PeerRecord> survey(const SwarmConfig& cfg, const std::string& peers, double wait_s) {
  const auto identity = identity_from_config(cfg);
  const auto bootstrap = split_peers(peers);
  if (bootstrap.empty())
    throw ConfigError("cohort swarm status needs --peers HOST:PORT of a live peer",
                      "for example --peers 10.0.0.1:7000");
  const auto host = p2p::split_host_port(bootstrap.front(), "--peers").first;
  // An address of this machine on the peer's network: the loopback one for a peer on loopback.
  const std::string listen = (host.rfind("127.", 0) == 0 ? std::string("127.0.0.1") : std::string("0.0.0.0")) + ":0";
  // A peer that knows others puts its record seldom (Note [A peer that knows others puts seldom] in
  // p2p/DirectoryDht.cpp): the DHT alone shows a live peer's record up to that much past its TTL.
  p2p::DirectoryOptions d;
  d.record_ttl_s += p2p::Directory::known_put_gap(d);
  p2p::Directory directory(identity, identity.token.run_public_key, listen, bootstrap, d,
                           [](const std::string& line) { std::cerr << "cohort: " << line << std::endl; });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(wait_s);
  std::vector<p2p::PeerRecord> seen;
  while (std::chrono::steady_clock::now() < deadline) seen = directory.fresh_peers(0.5);
  return seen;
}

SwarmPeer::SwarmPeer(const TrainConfig& cfg, p2p::Codec codec, const char* round_kind,
                     std::shared_ptr<comm::FlightRecorder> flight)
    : cfg_(cfg.swarm), identity_(identity_from_config(cfg.swarm)), flight_(std::move(flight)), round_kind_(round_kind) {
  if (cfg_.listen.empty())
    throw ConfigError("dist.strategy=swarm needs swarm.listen: the HOST:PORT where the other peers reach this one",
                      "pass swarm.listen=ADDRESS:PORT with an address of this machine the others can reach");
  const auto run_key = identity_.token.run_public_key;
  const auto say = [this](const std::string& line) { log(line); };
  transport_ = std::make_unique<p2p::Transport>(identity_, run_key, cfg_.listen, say);
  if (flight_) flight_->set_peer(p2p::peer_name(transport_->key()));
  transport_->on_arrival(p2p::MessageKind::kRecordAsk,
                         [](const p2p::Message&) { comm::request_flight_dump("asked by cohort doctor --ask"); });
  write_peer_file(cfg.run.dir, *transport_, cfg_.insecure);
  p2p::DirectoryOptions d;
  d.announce_s = cfg_.announce_s;
  d.dht_put_s = 2 * cfg_.announce_s;
  d.record_ttl_s = cfg_.peer_ttl_s;
  d.forms_grid = cfg_.group_size > 0 && cfg_.grid == "fixed";
  directory_ = std::make_unique<p2p::Directory>(identity_, run_key, transport_->address(),
                                                split_peers(cfg_.initial_peers), d, say, transport_.get());
  p2p::AveragingOptions a;
  a.matchmaking_s = cfg_.matchmaking_s;
  a.averaging_timeout_s = cfg_.averaging_timeout_s;
  a.min_group_size = cfg_.min_group_size;
  a.group_size = cfg_.group_size;
  a.leaving = [] { return util::stop_signal() != 0; };
  a.while_waiting = [this] {
    if (make_state_) state_server_.serve(*transport_, serving_step_, make_state_);
  };
  a.codec = codec;
  // See comm/FaultInjection.h: COHORT_FAULT_SWARM_ROUND=N, COHORT_FAULT_SWARM_SIGNAL=KILL or STOP.
  if (const char* round = std::getenv("COHORT_FAULT_SWARM_ROUND")) {
    a.fault_round = std::atoll(round);
    const char* sig = std::getenv("COHORT_FAULT_SWARM_SIGNAL");
    a.fault_signal = sig && std::string(sig) == "STOP" ? SIGSTOP : SIGKILL;
  }
  averager_ = std::make_unique<p2p::Averager>(*transport_, *directory_, a);
  if (const char* chunks = std::getenv("COHORT_FAULT_SWARM_DONOR_CHUNKS"))
    state_server_.fault_after_chunks = std::atoll(chunks);
  log("swarm: peer " + p2p::peer_name(identity_.token.peer_public_key) + " listening on " + transport_->address() +
      (cfg_.initial_peers.empty() ? ", the first peer" : ", joining through " + cfg_.initial_peers) +
      (cfg_.insecure ? " (swarm.insecure: no authentication)" : ""));
  directory_->announce({{}, transport_->address(), 0, 0, 0, false, false, 0});
  wait_for_peers(cfg_.min_peers_to_start, cfg.dist.timeout_s);
}

void SwarmPeer::wait_for_peers(int64_t count, double timeout_s) {
  if (count <= 1) return;
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::duration<double>(timeout_s);
  size_t seen = 0, most = 0;
  auto next_report = start + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < deadline) {
    const auto peers = directory_->fresh_peers(0.5);
    check_membership(peers);
    seen = peers.size();
    most = std::max(most, seen);
    // Where it stands every 5 s, so that a wait for peers that never come does not look like a hang.
    if (std::chrono::steady_clock::now() >= next_report && static_cast<int64_t>(seen) + 1 < count) {
      std::string names;
      for (const auto& p : peers) names += (names.empty() ? "" : ", ") + p2p::peer_name(p.key) + " at " + p.address;
      log("swarm: waiting for swarm.min_peers_to_start = " + std::to_string(count) + " peers; " +
          std::to_string(seen + 1) + " so far" + (names.empty() ? "" : " (this one and " + names + ")"));
      next_report += std::chrono::seconds(5);
    }
    if (static_cast<int64_t>(seen) + 1 >= count) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      log("swarm: " + std::to_string(seen + 1) + " peers in the swarm after " + std::to_string(s) + " s");
      return;
    }
  }
  // How many were live at once at best, and how many were ever seen, tell peers that never came from peers
  // that came but whose records arrived too late to count (a machine out of CPU: issue 41).
  char within[32];
  std::snprintf(within, sizeof within, "%g", timeout_s);
  throw CommError("swarm: " + std::to_string(seen + 1) + " of the " + std::to_string(count) +
                      " peers swarm.min_peers_to_start asks for are live after dist.timeout_s = " + within +
                      " s (at most " + std::to_string(most + 1) + " at once; " +
                      std::to_string(directory_->peers_seen() + 1) + " different peers seen)",
                  "start the other peers (with swarm.initial_peers naming a live one), or lower "
                  "swarm.min_peers_to_start; if more were seen than were ever live at once, the machines are "
                  "too loaded for records to arrive within swarm.peer_ttl_s: raise it");
}

SwarmPeer::~SwarmPeer() {
  transport_->on_arrival(p2p::MessageKind::kRecordAsk, nullptr);
  // Withdraw from matchmaking before the sockets close, so nobody waits for this peer in a new group.
  p2p::PeerRecord leaving;
  leaving.address = transport_->address();
  directory_->leave(leaving, 1.0);
}

void SwarmPeer::log(const std::string& line) const { std::cerr << "cohort: " << line << std::endl; }

// Note [A peer that is alone says why]
// A peer that trains alone while it was told to join others (swarm.initial_peers) is misconfigured more
// often than early. Three causes can be told apart, and each gets its own answer:
// - its token is another live process's (Note [One identity, one process] in p2p/DirectoryIdentity.cpp): it
//   stops, since two processes of one identity corrupt each other's records and frames;
// - the peers that answered all belong to another run (Note [A peer of another run is told so]): it
//   stops, naming both run keys, since it would never be let in;
// - nobody answered at all: it warns, after 3 matchmaking periods (at least 30 s) and then every minute,
//   naming its initial peers and what to check, and goes on. The others may not be up yet, and a peer
//   that waits for company is what Hivemind's peers do too; swarm.min_peers_to_start makes it wait
//   instead, and fail after dist.timeout_s.
// Without swarm.group_size every round waits on every peer. Past 32 peers bounded groups trained faster
// on this project's machines and matched ddp's accuracy (docs/scaling.md), but the default stays one group:
// it is ddp's computation, bit for bit, and peers cannot switch at one moment (each counts the swarm
// differently). So a peer says so, once.
void SwarmPeer::suggest_groups(size_t swarm) {
  if (cfg_.group_size > 0 || suggested_groups_ || swarm <= 32) return;
  suggested_groups_ = true;
  log("swarm: " + std::to_string(swarm) + " peers average in one group, every round waiting on each of them; " +
      "swarm.group_size=8 or 16 (the same on every peer, set at their next start) bounds that (docs/scaling.md)");
}

void SwarmPeer::check_membership(const std::vector<p2p::PeerRecord>& peers) {
  if (const auto taken = directory_->identity_taken(); !taken.empty())
    throw ConfigError("swarm.token" + (cfg_.token.empty() ? std::string() : "=" + cfg_.token) + ": " + taken,
                      "give each peer its own token: cohort swarm token --key run.key --ttl 24h --out peerN.token");
  const auto now = std::chrono::steady_clock::now();
  if (!peers.empty()) {
    met_anyone_ = true;
    alone_since_ = now;
    suggest_groups(peers.size() + 1);
    return;
  }
  if (const auto refusals = directory_->refusals(); !refusals.empty() && !met_anyone_) {
    const auto& r = refusals.front();
    const auto theirs = p2p::hex(r.run_key.data(), 4), mine = p2p::hex(identity_.token.run_public_key.data(), 4);
    throw ConfigError(
        "swarm: " + std::to_string(refusals.size()) + " peer(s) refuse this peer (peer " + p2p::peer_name(r.peer) +
            " at " + r.address + "): they belong to the run whose key begins " + theirs + ", and this peer's " +
            (cfg_.insecure ? "swarm.insecure identity" : "token (swarm.token=" + cfg_.token + ")") +
            " to the run whose key begins " + mine,
        cfg_.insecure
            ? "that swarm is authenticated: ask its owner for a token (cohort swarm token --key run.key "
              "--out peer.token) and pass swarm.token=peer.token instead of swarm.insecure"
            : "issue this peer's token with that run's key: cohort swarm token --key <that run's run.key> "
              "--ttl 24h --out peer.token (or, if that swarm runs with swarm.insecure=true, set it here too)");
  }
  if (cfg_.initial_peers.empty()) return;
  const double wait_s = std::max(30.0, 3 * cfg_.matchmaking_s);
  if (now - alone_since_ < std::chrono::duration<double>(wait_s) || now - alone_warned_ < std::chrono::seconds(60))
    return;
  alone_warned_ = now;
  const double alone_s = std::chrono::duration<double>(now - alone_since_).count();
  log("swarm: WARNING: this peer has known no live peer for " + std::to_string(static_cast<int64_t>(alone_s)) +
      " s and trains alone. Its initial peers (swarm.initial_peers=" + cfg_.initial_peers +
      ") do not answer: check that a peer runs there, that this machine reaches HOST:PORT over TCP and UDP, and "
      "that swarm.listen (" +
      transport_->address() + ") is an address they can reach back");
}

at::Tensor SwarmPeer::average(int64_t step, const at::Tensor& flat, int64_t samples, int64_t& wire_bytes) {
  const auto before = transport_->stats();
  p2p::PeerRecord mine;
  mine.samples = samples;
  mine.samples_per_s = samples_per_s_;
  mine.group_size = last_group_size_;
  // The key a peer takes where its coordinates come to stay goes to everyone: the leader of the key its
  // record named would wait for it there.
  if (settle_on_grid(step)) announce_at(step, samples, false, p2p::Directory::Reach::kEveryone);
  mine.group_key = group_key_for(step);
  mine.grid = grid_word();
  mine.census = census();
  if (flight_) flight_->round_began(step + 1, round_kind_);
  auto out = averager_->average(static_cast<uint64_t>(step), flat, static_cast<double>(samples), mine);
  record_round(step + 1, out);
  const auto after = transport_->stats();
  // The averaging's bytes: the records sent meanwhile are the directory's (swarm_bytes_sent counts both).
  wire_bytes = (after.bytes_sent - after.record_bytes_sent) - (before.bytes_sent - before.record_bytes_sent);
  ++rounds_;
  last_group_ = out.group;
  leader_swarm_ = out.swarm;
  move_on_grid(step, out.group.size() > 1 ? out.place : 0, out.keys, out.moved);
  last_group_size_ = static_cast<int64_t>(out.group.size());
  group_size_sum_ += last_group_size_;
  last_round_s_ = out.matchmaking_s + out.averaging_s;
  longest_round_s_ = std::max(longest_round_s_, last_round_s_);
  last_averaging_s_ = out.averaging_s;
  // Silent or declining members, a contribution that was not finite: the weights' round would meet the same.
  last_round_whole_ = out.problem.empty();
  last_state_s_ = 0;
  if (!out.problem.empty()) {
    ++failed_rounds_;
    log("swarm: step " + std::to_string(step + 1) + ": " + out.problem);
  }
  // Note [A peer that fell out of a round resynchronizes]
  // A record reaches the others late (by up to a second through the DHT; by milliseconds since records go
  // to the peers directly), so a leader can close a group while a peer on the same step is not yet seen
  // as waiting; that peer then takes a local step and its weights leave the others' for
  // good (averaging gradients never brings them back). Hivemind averages parameters now and then for
  // this; a cohort peer that averaged alone while others live downloads, at its next step (catch_up),
  // the state of a peer on its step or ahead whose last group was larger (its record says so: when every
  // peer was alone, nobody copies anybody). Peers serve their state while they wait in matchmaking too,
  // so that the peer that fell out finds a donor at once. Parts lost to a peer that died mid-round still
  // leave the survivors slightly apart: without swarm.group_size for good (the digest then finds them),
  // with it until the weights are next averaged.
  out_of_step_ = out.group.size() <= 1 && !directory_->peers().empty();
  since_ = std::chrono::steady_clock::now();
  // A peer told to stop leaves after this step (Note [Leaving a swarm]): the others stop counting on it now.
  const bool leaving = util::stop_signal() != 0;
  if (out.group.size() <= 1) join_smallest_group(step + 1);
  // The leader told the others where it dealt this peer (Note [A leader deals its groups over the next
  // round's keys] in p2p/Matchmaking.cpp): the new step goes to the new key's peers, the rest hear it with
  // the next heartbeat.
  const bool dealt = out.keys > 1 && out.group.size() > 1 && !out.claimed_twice && !leaving && all_take_deals();
  // One whose coordinates stay tells the peers of its next two rounds (Note [A grid whose coordinates stay]);
  // the first time, everyone: a leader that dealt it before it formed would wait at the dealt key for it
  // (seen: 24 of 32 peers stuck at step 4 for 40 steps), and the record on the new step undoes the deal.
  const bool first = coordinates_stay() && !grid_told_everyone_;
  grid_told_everyone_ = coordinates_stay();
  const auto reach = first                            ? p2p::Directory::Reach::kEveryone
                     : coordinates_stay() && !leaving ? p2p::Directory::Reach::kGrid
                     : dealt                          ? p2p::Directory::Reach::kDealt
                                                      : p2p::Directory::Reach::kEveryone;
  announce_at(step + 1, 0, leaving, reach);
  if (leaving) log("swarm: leaving after step " + std::to_string(step + 1) + "; the others go on without this peer");
  return out.averaged;
}

// Note [Weights averaged at every step in bounded groups]
// In groups smaller than the swarm, each group applies its own averaged gradient to weights its members
// brought from different groups, so the peers' weights part, and only averaging the weights brings them
// back (Note [Groups on a grid] in p2p/Matchmaking.cpp). How often decides the accuracy. The MLP on
// Fashion-MNIST, 32 peers in groups of 8, the default recipe's whole schedule (onecycle over 2.7
// epochs, peak 0.4), test top-1 over 3 seeds against ddp's 83.08% on the same global batch
// (bench/scale.py --accuracy 32, bench/results/scale_state_every.json): every 10 steps 76.26%, every
// step 84.52% (seed 0, every 3 steps: 83.59%). The first measurement, every 10 steps within 0.26 points
// of ddp, stopped in onecycle's warmup at a 25th of the peak, where the weights hardly move. Hivemind's
// average_state_every is 1 too. So 0 (the default) means every step for the swarm: a second all-reduce
// in each round, the weights' size, in fp32 (p2p/Averager.cpp); 64 peers in groups of 8 on 2 cores
// trained in about 1.3 times the time. DiLoCo averages its outer weights and momentum (twice the model)
// in outer rounds whose pseudo-gradients travel in int8, so there every outer round would take 9 times
// the bytes; it keeps every 10 outer rounds. That costs accuracy: 32 DiLoCo peers, 10 inner steps at a
// rate for their 32-sample batch, 16 outer rounds, groups of 8 (one seed): every outer round 77.94% and
// 78.08% at peak 0.05 and 0.1, every 10 rounds 76.84% and 72.21%, one group 78.56% and 79.33%; at 0.1
// over 3 seeds, 78.13% against 74.01%. A run that can afford the bytes sets swarm.average_state_every=1
// (docs/scaling.md); the default is not changed on 16 outer rounds of an MLP, since the bytes fall on
// DiLoCo's own case, slow links.
int64_t state_average_every(const SwarmConfig& cfg, bool diloco) {
  if (cfg.average_state_every > 0) return cfg.average_state_every;
  return diloco ? 10 : 1;
}

// Note [Groups on a grid] (p2p/Matchmaking.cpp): groups smaller than the swarm apply different averaged
// gradients, so their weights part; every swarm.average_state_every steps the step's group also averages
// its weights (as hivemind.Optimizer's average_state_every), in groups that change from round to round.
// No matchmaking: the group is the one the gradient round just formed. The distance from the group's
// average before it is reported (swarm_state_distance: relative L2), to see how far groups drift.
at::Tensor SwarmPeer::average_state(int64_t step, const at::Tensor& flat, int64_t& wire_bytes, bool may_skip) {
  // A member silent in the gradient round (dead, frozen, cut off), or in another group, would be waited for
  // again, up to swarm.averaging_timeout_s: with weights averaged at every step the group leaves them to
  // the next. A member whose round went well averages now and waits out the timeout for those that skip,
  // as in any round: a partial average, never a wrong one.
  if (last_group_.size() <= 1 || (may_skip && !last_round_whole_)) return flat;
  const auto began = std::chrono::steady_clock::now();
  const auto before = transport_->stats();
  const uint64_t round = static_cast<uint64_t>(step + 1) | p2p::kParametersRound;
  if (flight_) flight_->round_began(step + 1, "weights");
  auto out = averager_->all_reduce(round, last_group_, flat, 1.0);
  record_round(step + 1, out);
  const auto after = transport_->stats();
  wire_bytes += (after.bytes_sent - after.record_bytes_sent) - (before.bytes_sent - before.record_bytes_sent);
  ++state_rounds_;
  const double norm = out.averaged.norm().item<double>();
  state_distance_ = norm > 0 ? (flat - out.averaged).norm().item<double>() / norm : 0.0;
  if (!out.problem.empty()) log("swarm: step " + std::to_string(step + 1) + ": averaging the weights: " + out.problem);
  last_state_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
  return out.averaged;
}

// Note [A swarm peer's rounds in its record] (comm/FlightRecorder.cpp): the round's group and silent
// members; a silent member has the record written now.
void SwarmPeer::record_round(int64_t step, const p2p::RoundOutcome& out) {
  if (!flight_) return;
  std::vector<std::string> group;
  for (const auto& m : out.group) group.push_back(p2p::peer_name(m.key));
  flight_->round_ended(step, group, out.silent, out.problem);
  if (!out.silent.empty()) comm::request_flight_dump("a swarm round with a silent member");
}

std::vector<std::pair<std::string, double>> SwarmPeer::figures() const {
  const auto s = transport_->stats();
  return {{"swarm_rounds", static_cast<double>(rounds_)},
          {"swarm_failed_rounds", static_cast<double>(failed_rounds_)},
          {"swarm_group_size", static_cast<double>(last_group_size_)},
          {"swarm_mean_group_size", rounds_ > 0 ? static_cast<double>(group_size_sum_) / rounds_ : 0.0},
          {"swarm_round_seconds", last_round_s_},
          {"swarm_longest_round_seconds", longest_round_s_},
          {"swarm_averaging_seconds", last_averaging_s_},
          {"swarm_state_seconds", last_state_s_},
          {"swarm_bytes_sent", static_cast<double>(s.bytes_sent)},
          {"swarm_bytes_received", static_cast<double>(s.bytes_received)},
          // Of swarm_bytes_sent, the directory's records: background traffic, not averaging or state.
          {"swarm_record_bytes_sent", static_cast<double>(s.record_bytes_sent)},
          {"swarm_record_frames_sent", static_cast<double>(s.record_frames_sent)},
          // Of those, the deals this peer sent as a leader (Note [A leader deals its groups over the next
          // round's keys] in p2p/Matchmaking.cpp): the part that grows with the swarm.
          {"swarm_deal_bytes_sent", static_cast<double>(s.deal_bytes_sent)},
          {"swarm_deal_frames_sent", static_cast<double>(s.deal_frames_sent)},
          // Background traffic the transport does not carry: the DHT's, over UDP (Note [The run's records
          // in sixteen buckets] in p2p/DirectoryDht.cpp).
          {"swarm_dht_bytes_sent", static_cast<double>(directory_->dht_bytes_sent())},
          {"swarm_frames_refused", static_cast<double>(s.frames_refused)},
          {"swarm_peers_seen", static_cast<double>(directory_->peers_seen())},
          // The live records it holds now: every peer with swarm.grid=dealt, a bounded set with fixed (Note [A
          // grid whose coordinates stay] in SwarmGrid.cpp).
          {"swarm_peers_known", static_cast<double>(directory_->peers().size())},
          {"swarm_state_rounds", static_cast<double>(state_rounds_)},
          {"swarm_state_distance", state_distance_}};
}

}  // namespace cohort::parallel::swarm

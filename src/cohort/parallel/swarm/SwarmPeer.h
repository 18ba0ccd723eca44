// This peer's place in the swarm, held by its first worker: its identity (swarm.token, or the public
// insecure key with swarm.insecure), the transport, the DHT directory and the averager, and the
// figures the run log and summary.json report (rounds, group sizes, failed rounds, bytes, peers seen).
//
//   parallel::swarm::SwarmPeer peer(cfg);
//   if (peer.ready(step, samples, cfg.swarm.target_batch_size, batch))
//     gradient = peer.average(step, gradient, samples, wire_bytes);
#pragma once

#include <array>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "cohort/comm/FlightRecorder.h"
#include "cohort/config/Config.h"
#include "cohort/p2p/Auth.h"
#include "cohort/p2p/Codec.h"
#include "cohort/p2p/Directory.h"
#include "cohort/p2p/StateTransfer.h"
#include "cohort/util/OldNames.h"  // the names of the last release, for programs outside this tree

namespace cohort::p2p {
class Transport;
class Directory;
class Averager;
struct RoundOutcome;
struct Member;
}  // namespace cohort::p2p

namespace cohort::parallel::swarm {

// The identity a peer runs with: swarm.token's, or with swarm.insecure a throwaway one under the
// well-known insecure run key (Hivemind's default: no authentication). Throws ConfigError naming the key.
p2p::PeerIdentity identity_from_config(const SwarmConfig& cfg);

// `cohort swarm status`: the live peers of the run `cfg`'s identity belongs to, as the DHT reached
// through `peers` (comma-separated HOST:PORT) lists them after `wait_s` seconds. Joins as an observer:
// it announces nothing.
std::vector<p2p::PeerRecord> survey(const SwarmConfig& cfg, const std::string& peers, double wait_s);

// swarm.average_state_every with 0 resolved: every step for the swarm, every 10 outer rounds for DiLoCo
// (Note [Weights averaged at every step in bounded groups] in SwarmPeer.cpp).
int64_t state_average_every(const SwarmConfig& cfg, bool diloco);

// Where a peer listens, as it writes at start to RUN_DIR/flight/swarm.json, for `cohort doctor --ask`
// (Note [Asking swarm peers for their records] in SwarmPeer.cpp). read_peer_file: nullopt when the run
// dir has none (not a swarm peer's, or one from before this file); throws Error naming a malformed one.
struct PeerFile {
  std::string address;
  p2p::PeerKey peer{};
  bool insecure = false;
};
std::optional<PeerFile> read_peer_file(const std::filesystem::path& run_dir);
// What a peer writes there (nothing for an empty run dir; a warning when it cannot).
void write_peer_file(const std::string& run_dir, const p2p::Transport& transport, bool insecure);
// Asks each of `peers` to write its flight record (to its own run dir, on its own machine), as `identity`:
// a token of their run. The frames leave from the returned transport's thread: keep it while waiting.
std::unique_ptr<p2p::Transport> ask_for_records(const std::vector<PeerFile>& peers, const p2p::PeerIdentity& identity);

// Note [Peers that drifted apart resynchronize] (SwarmPeer.cpp): given this peer's weight digests by step
// (`digests`), its key and the others' records, the records of the peers holding the weights most peers
// agree on for the latest step both sides know, when this peer's differ; else empty. Pure.
std::vector<p2p::PeerRecord> drifted_from(const std::map<int64_t, uint64_t>& digests, const p2p::PeerKey& me,
                                          const std::vector<p2p::PeerRecord>& peers);

// Note [The target batch counted in the key and scaled to the swarm] (SwarmProgress.cpp): the samples the
// swarm will have trained toward `step` once every peer still training on it finishes its batch, as a
// peer sees it at `now_unix` from `peers` (the live records): its own `samples`, each other's announced
// samples, what each still training has trained since its record at its speed (Note [Samples trained
// since the record]), and a `batch` for each. `key` 0 (no swarm.group_size): every record counts. Else
// only the records of the peers on the step with group key `key` (or dealt there), scaled by `swarm`, the
// swarm's live peers, over the peers counted. Pure.
int64_t samples_toward(int64_t step, int64_t samples, int64_t batch, uint64_t key, int64_t swarm,
                       const std::vector<p2p::PeerRecord>& peers, double now_unix);

class SwarmPeer {
 public:
  // `codec`: how the rounds put the averaged vector on the wire (swarm.compress, or DiLoCo's diloco.compress).
  // `round_kind`: what a round averages, as the flight record names it: "average" (the swarm's gradients)
  // or "outer" (DiLoCo's outer step); the strategy that owns the peer says which.
  // `flight`: this process's flight recorder, which keeps the peer's rounds (Note [A swarm peer's rounds
  // in its record] in comm/FlightRecorder.cpp); null: none.
  SwarmPeer(const TrainConfig& cfg, p2p::Codec codec, const char* round_kind,
            std::shared_ptr<comm::FlightRecorder> flight = nullptr);
  ~SwarmPeer();

  // Announces this peer's progress toward `step` and says whether the swarm reaches `target` samples
  // for it with the batches already under way: this peer's `samples`, those the others announced for
  // the same step, and a `batch` for each of them still training on it (Note [A swarm step is the target
  // batch, not twice it]); with swarm.group_size, as its key's peers count it (samples_toward).
  bool ready(int64_t step, int64_t samples, int64_t target, int64_t batch);
  // One round for `step`: the group's weighted mean of `flat` where it arrived (Note [What a round does
  // when a peer fails]); adds this round's bytes sent to `wire_bytes`. Logs what went wrong, if anything.
  at::Tensor average(int64_t step, const at::Tensor& flat, int64_t samples, int64_t& wire_bytes);
  // With swarm.group_size, every state_average_every steps: `flat` (the trainable parameters) averaged
  // over the group of `step`'s round, equally weighted, in fp32; adds the bytes sent to `wire_bytes`. A
  // peer that averaged alone gets `flat` back, and so does one whose round went wrong when `may_skip`
  // (the weights are averaged again at the next step).
  at::Tensor average_state(int64_t step, const at::Tensor& flat, int64_t& wire_bytes, bool may_skip);

  std::vector<std::pair<std::string, double>> figures() const;

  // Answers the state requests that have arrived with this peer's state at `step` (between steps).
  void serve_state(int64_t step, const std::function<std::string()>& make_state);
  // When live peers are ahead of `step`: their state, downloaded and verified (nullopt: nobody is ahead,
  // or no donor delivered; logged). The first call (at start) reads the DHT afresh; later ones (between
  // steps) use the last read and act only on peers two or more steps ahead (one ahead is a peer that
  // finished the same round first).
  std::optional<p2p::DownloadedState> catch_up(int64_t step);
  // Announces that this peer is `samples` into `step` (a DiLoCo peer's position within its outer round).
  void progress(int64_t step, int64_t samples);
  // The most samples a live peer announced into `step` (0: none): where the others are within it.
  int64_t others_progress(int64_t step) const;
  // This peer's weights after `step` have the digest `digest_of_weights` computes (PeerState.h's
  // weights_digest): announced, and compared with the others' at its next catch_up (Note [Peers that
  // drifted apart resynchronize]). Computed only where digests are compared: not with swarm.group_size.
  void settled(int64_t step, const std::function<uint64_t()>& digest_of_weights);

 private:
  void log(const std::string& line) const;
  // Stops this peer (ConfigError) when its identity is another live process's, or when only peers of
  // another run answered it; warns when it has met nobody for long (Note [A peer that is alone says why]).
  // `peers`: the live peers as the directory lists them now.
  void check_membership(const std::vector<p2p::PeerRecord>& peers);
  // Logs, once a step, a live peer that is ahead of this one at `step`.
  void log_peers_ahead(int64_t step, const std::vector<p2p::PeerRecord>& peers);
  // Logs, once, that a swarm of `swarm` peers past 32 in one group would round faster in bounded ones.
  void suggest_groups(size_t swarm);
  void announce_at(int64_t step, int64_t samples, bool leaving = false,
                   p2p::Directory::Reach reach = p2p::Directory::Reach::kEveryone);
  // Note [Groups on a grid] (p2p/Matchmaking.cpp): the group key this peer announces for `step`, and the
  // move of its coordinate after that round, where it had `place` among its key's peers on a grid of
  // `keys` keys (its leader's count; 0: this peer's own); where its coordinates stay, the coordinate its
  // leader `moved` it to (Note [An overfull key splits]; -1: none).
  uint64_t group_key_for(int64_t step) const;
  void move_on_grid(int64_t step, int64_t place, int64_t keys, int64_t moved);
  void join_smallest_group(int64_t step);  // Note [A lone peer joins the smallest group]
  // With swarm.grid=fixed: whether its coordinates stay, as its record says (PeerRecord::grid).
  bool coordinates_stay() const;
  uint64_t grid_word() const;
  // Where its coordinates stay: the live peers on its column and on its row, as its mates' records say
  // (PeerRecord::census); 0 otherwise.
  uint64_t census() const;
  // A peer that none dealt yet, among peers whose coordinates stay, takes the fewest-held row and column.
  bool settle_on_grid(int64_t step);  // whether its coordinates came to stay now
  void log_coordinates(int64_t step, const char* how) const;
  void split_off(int64_t step, uint64_t moved);  // Note [An overfull key splits]
  void warn_grid_not_formed(const p2p::PeerRecord& other);
  bool all_take_deals() const;  // every live peer reads deals (PeerRecord::kTakesDeals)
  static bool all_take_deals(const std::vector<p2p::PeerRecord>& peers);  // of these
  void record_round(int64_t step, const p2p::RoundOutcome& out);
  // Blocks until `count` peers (this one included) are in the swarm; CommError after `timeout_s`.
  void wait_for_peers(int64_t count, double timeout_s);
  // The parts of catch_up: the peers it looks at, whom it downloads from, and the download itself.
  std::vector<p2p::PeerRecord> live_peers(bool starting);
  std::vector<p2p::PeerRecord> donors_for(int64_t step, int64_t ahead, const std::vector<p2p::PeerRecord>& peers,
                                          bool starting, bool resync, bool& drifted) const;
  std::optional<p2p::DownloadedState> download_newest(const std::vector<p2p::PeerRecord>& donors);

  SwarmConfig cfg_;
  p2p::PeerIdentity identity_;
  std::unique_ptr<p2p::Transport> transport_;
  std::unique_ptr<p2p::Directory> directory_;
  std::unique_ptr<p2p::Averager> averager_;
  int64_t rounds_ = 0, failed_rounds_ = 0, group_size_sum_ = 0, last_group_size_ = 1;
  double last_round_s_ = 0, last_averaging_s_ = 0, samples_per_s_ = 0;
  double last_state_s_ = 0;  // the last averaging of the weights (swarm.average_state_every)
  // The longest round since this process started: a metrics record carries its own step's round only, so
  // a log every 50 steps would show one round in 50 (a stall after a killed peer among the others).
  double longest_round_s_ = 0;
  int64_t behind_logged_ = -1;
  // The live peers the last round's leader counted (RoundOutcome::swarm; 0: none said): the swarm the
  // target batch is scaled to (Note [The target batch counted in the key and scaled to the swarm]).
  int64_t leader_swarm_ = 0;
  // The last time progress() went to every live peer (Note [A DiLoCo peer's progress goes to its key]).
  std::chrono::steady_clock::time_point progress_to_everyone_{};
  bool out_of_step_ =
      false;  // the last round went on without this peer (Note [A peer that fell out of a round resynchronizes])
  int64_t serving_step_ = -1;
  std::function<std::string()> make_state_;
  bool started_ = false;                 // catch_up was called once
  std::map<int64_t, uint64_t> digests_;  // this peer's weights' digests after its last few steps
  p2p::StateServer state_server_;
  std::chrono::steady_clock::time_point since_{std::chrono::steady_clock::now()};
  std::chrono::steady_clock::time_point alone_since_{std::chrono::steady_clock::now()}, alone_warned_{};
  bool met_anyone_ = false;
  std::shared_ptr<comm::FlightRecorder> flight_;
  const char* round_kind_;              // in the flight record: "average" (gradients), or "outer" (DiLoCo's)
  std::array<uint64_t, 2> grid_{0, 0};  // this peer's coordinates (Note [Groups on a grid])
  // With swarm.grid=fixed: whether its coordinates stay, and the key count of its grid. They stay from step
  // kGridForms (Note [A grid whose coordinates stay] in SwarmGrid.cpp).
  static constexpr int64_t kGridForms = 2;
  bool coordinates_stay_ = false;
  bool warned_grid_ = false;         // warn_grid_not_formed has logged
  bool grid_told_everyone_ = false;  // its first step since its coordinates stay went to everyone
  int64_t grid_keys_ = 0;
  std::vector<p2p::Member> last_group_;  // the last round's group, in its order
  bool last_round_whole_ = true;         // it went without a problem (no silent or declining member)
  bool suggested_groups_ = false;        // suggest_groups has logged
  int64_t state_rounds_ = 0;
  double state_distance_ = 0;  // relative L2 distance of the weights from the group's average, last time
};

}  // namespace cohort::parallel::swarm

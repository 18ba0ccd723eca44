#include "cohort/train/Checkpointing.h"

#include <algorithm>

#include "cohort/amp/MasterWeights.h"
#include "cohort/checkpoint/Names.h"
#include "cohort/checkpoint/ShardedCheckpoint.h"
#include "cohort/checkpoint/Steps.h"
#include "cohort/checkpoint/TrainingState.h"
#include "cohort/train/RankAgreement.h"

namespace cohort::train {
namespace fs = std::filesystem;

Checkpointer::Checkpointer(const TrainConfig& cfg, const fs::path& run_dir, comm::World& world, Owners owners,
                           std::string config_json)
    : cfg_(cfg),
      ck_dir_(run_dir / checkpoint::names::kCheckpointsDir),
      world_(world),
      owners_(owners),
      config_json_(std::move(config_json)),
      lead_(world.info.rank == 0) {}

checkpoint::TrainState Checkpointer::train_state(const SavePoint& at) const {
  checkpoint::TrainState st{at.step, at.epoch_of_next, at.best, world_.info.world_size, config_json_};
  if (owners_.precision.scaling()) {
    const auto& sc = owners_.precision.scaler().state();
    st.loss_scale = sc.scale, st.loss_scale_growth_tracker = sc.growth_tracker, st.skipped_steps = sc.skipped_steps;
  }
  return st;
}

// "best" lives in the checkpoints folder itself; each "last" gets a fresh step directory, which rank 0
// names for a sharded save (every rank writes into it).
fs::path Checkpointer::directory_for(const std::string& tag, int64_t step, bool sharded) {
  if (tag != checkpoint::names::kLast) return ck_dir_;
  if (!sharded) return checkpoint::new_step_dir(ck_dir_, step);
  return decided_by_rank0(world_, "cohort/ckpt_dir/" + std::to_string(sharded_saves_++),
                          [&] { return checkpoint::new_step_dir(ck_dir_, step).string(); });
}

void Checkpointer::save(const std::string& tag, const SavePoint& at) {
  const bool last = tag == checkpoint::names::kLast;
  // The end of training often saves the state the last periodic save already holds: a second copy
  // would only push an older, distinct save out of retention. (step and best agree on every rank.)
  if (last && at.step == last_saved_step_ && at.best == last_saved_best_) return;
  if (last) last_saved_step_ = at.step, last_saved_best_ = at.best;
  const auto st = train_state(at);
  // Collective: a sharded strategy hands each rank's slices, a compression hook gathers its residuals.
  auto state = owners_.strategy.save_state();
  const fs::path dir = directory_for(tag, at.step, state.shards.has_value());
  if (state.shards) {  // every rank writes its slice; see checkpoint/ShardedCheckpoint.h
    const auto by = last ? checkpoint::CommitBy::kStepDirectory : checkpoint::CommitBy::kMarkerFile;
    checkpoint::save_sharded(dir, tag, *state.shards, st, *world_.comm, by);
  } else if (lead_) {
    checkpoint::TrainingStateParts parts{std::move(state.optimizer), std::move(state.resume), {}};
    if (owners_.lookahead) parts.lookahead = owners_.lookahead->state_dict();
    checkpoint::save(dir, tag, owners_.model, checkpoint::join_training_state(parts), st);
  }
  if (last && lead_) checkpoint::commit_step(ck_dir_, dir, at.step, static_cast<int>(cfg_.ckpt.keep_last));
}

void Checkpointer::restore(const checkpoint::Checkpoint& resume) {
  auto parts = checkpoint::split_training_state(resume.optimizer);
  // A sharded save's weights are its float32 masters (its shards hold nothing else): under fp16-master
  // they become the masters again, not the fp16 weights rounded from them. A ddp save names its own.
  const bool has_masters = std::any_of(parts.optimizer.begin(), parts.optimizer.end(),
                                       [](const auto& e) { return e.first.rfind(amp::kMasterPrefix, 0) == 0; });
  auto& precision = owners_.precision;
  if (precision.precision() == amp::Precision::kFp16Master && !has_masters)
    for (const auto& [name, t] : resume.model) parts.optimizer.emplace_back(amp::kMasterPrefix + name, t);
  owners_.strategy.load_state(parts.optimizer, parts.strategy);
  if (owners_.lookahead && !parts.lookahead.empty()) owners_.lookahead->load_state_dict(parts.lookahead);
  const auto& st = resume.state;
  if (precision.scaling() && st.loss_scale > 0)
    precision.load_scaler({st.loss_scale, st.loss_scale_growth_tracker, st.skipped_steps});
}

}  // namespace cohort::train

#include "cohort/commands/Eval.h"

#include <filesystem>
#include <iomanip>
#include <iostream>

#include <torch/torch.h>

#include "cohort/checkpoint/Checkpoint.h"
#include "cohort/checkpoint/Steps.h"
#include "cohort/data/Datasets.h"
#include "cohort/data/DistributedSampler.h"
#include "cohort/models/Models.h"
#include "cohort/record/RunLog.h"
#include "cohort/train/AutoSettings.h"
#include "cohort/train/Device.h"
#include "cohort/train/Evaluate.h"
#include "cohort/train/Setup.h"
#include "cohort/util/AtomicFile.h"

namespace cohort::commands {
namespace fs = std::filesystem;

EvalResult run_eval_worker(const TrainConfig& cfg, const comm::WorldInfo& info, const fs::path& checkpoint,
                           const fs::path& out) {
  comm::World world = train::join_world(cfg, info);
  const c10::Device device = train::training_device(cfg.train.device, info.local_rank);
  TrainConfig resolved = cfg;  // evaluation computes in fp32; only the layout is chosen (Note [What auto picks])
  train::resolve_auto(resolved, train::probe_hardware(device));
  const train::EvalPlacement placement{device, train::channels_last(resolved), nullptr};
  auto data = data::open_datasets(cfg, info.rank, info.local_world_size, /*need_train=*/false, placement.device);
  auto model = models::build(cfg.model, data.test->channels(), data.test->image_size());
  const auto weights = checkpoint::load_model_weights(checkpoint);
  checkpoint::load_weights(*model, weights.tensors, weights.source);
  data::DistributedSampler sampler(data.test->size(), info.world_size, info.rank, false, cfg.train.seed, false);
  model->to(placement.device);
  if (placement.channels_last) train::to_channels_last(*model);
  const auto r = train::evaluate(*model, *data.test, sampler, cfg.eval.batch_size, train::prefetch_batches(cfg),
                                 cfg.eval.tta, *world.comm, placement);
  EvalResult e{r.loss(), r.top1(), r.top5(), static_cast<int64_t>(r.count)};
  if (info.rank == 0) {
    const nlohmann::json j = {{"checkpoint", fs::absolute(checkpoint).string()},
                              {"model", cfg.model.name},
                              {"dataset", cfg.data.name},
                              {"images", e.images},
                              {"loss", e.loss},
                              {"top1", e.top1},
                              {"top5", e.top5},
                              {"world_size", info.world_size}};
    std::cout << "cohort: eval " << checkpoint.string() << " on " << e.images << " images: top1 "
              << record::percent(e.top1) << " top5 " << record::percent(e.top5) << " loss " << std::setprecision(4)
              << e.loss << std::endl;
    if (!out.empty()) util::write_file_atomic(out, j.dump(2) + "\n");
  }
  world.comm->barrier("end of evaluation")->wait();
  return e;
}

}  // namespace cohort::commands

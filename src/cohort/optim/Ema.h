// An exponential moving average of a module's floating-point parameters and buffers, for evaluating with
// averaged weights (Ema::update + swap_in/swap_out) or for airbench's lookahead (Ema::lookahead), which also
// pulls the training weights back to the average.
//
//   cohort::optim::Ema ema(*net, /*decay=*/0.999);
//   for (...) { loss.backward(); opt.step(lr); ema.update(*net); }       // one EMA step per optimizer step
//   ema.swap_in(*net); evaluate(*net); ema.swap_out(*net);                // evaluate the average, then go on
//
//   // airbench: every 5 steps after epoch 3, decay from airbench_lookahead_decay(step, total)
//   if (step % 5 == 0) ema.lookahead(*net, cohort::optim::airbench_lookahead_decay(step, total));
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/nn/module.h>

namespace cohort::optim {

// Same type as checkpoint::NamedTensors (an alias of the same std::vector), so the two mix freely.
using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// Tracks every floating-point entry of named_parameters() and named_buffers() (BatchNorm running statistics
// included, integer counters such as num_batches_tracked excluded; frozen parameters are tracked too, they
// simply never move). The average lives on the module's device; 16-bit tensors are averaged in float32 so
// a decay near 1 does not round every update away.
//
// update() and lookahead() differ in what they leave in the module:
//   update(m):      ema = decay * ema + (1 - decay) * m        m unchanged; the EMA only serves evaluation.
//   lookahead(m):   ema = decay * ema + (1 - decay) * m; m = ema
//                   the training weights jump back to the average and training continues from there (the
//                   optimizer's momentum is left as it is, as airbench does). decay 1 just restores m from
//                   the average, which airbench does at the end of every epoch.
class Ema {
 public:
  // Snapshots the module's current values as the starting average. Throws ConfigError unless 0 <= decay <= 1.
  Ema(const torch::nn::Module& module, double decay);

  // One EMA step with the constructor's decay. Call it after every optimizer step; to update only every k
  // steps, construct with per_step_decay^k (decay_every) so the average spans the same number of steps.
  void update(const torch::nn::Module& module);
  // One EMA step with an explicit decay (for schedules that warm the decay up).
  void update(const torch::nn::Module& module, double decay);

  // See the class comment: update, then copy the average into the module.
  void lookahead(torch::nn::Module& module, double decay);

  // Writes the average into the module (one way; the module's own values are lost).
  void copy_to(torch::nn::Module& module) const;
  // swap_in saves the module's values and writes the average into it, for evaluation; swap_out restores the
  // saved values. The average itself is not touched, so it keeps full precision. update, lookahead and
  // load_state_dict are refused while swapped in (they would average the average with itself).
  void swap_in(torch::nn::Module& module);
  void swap_out(torch::nn::Module& module);
  bool swapped_in() const { return swapped_; }

  double decay() const { return decay_; }
  int64_t num_updates() const { return num_updates_; }  // update() and lookahead() calls since construction

  // The average under the module's own names ("layers.0.conv1.weight", "layers.0.norm1.running_mean"), so
  // it loads as model weights; a checkpoint that stores it next to the model should prefix the names.
  NamedTensors state_dict() const;
  // Copies values in by name. Throws CheckpointError naming a missing, unknown or mis-shaped tensor.
  void load_state_dict(const NamedTensors& state);

  // The per-update decay that, applied every k steps, matches per_step_decay applied every step.
  static double decay_every(double per_step_decay, int64_t k);

 private:
  std::vector<at::Tensor> module_tensors(const torch::nn::Module& module) const;
  void check_not_swapped(const char* what) const;

  double decay_;
  int64_t num_updates_ = 0;
  bool swapped_ = false;
  std::vector<std::string> names_;
  std::vector<at::Tensor> average_;
  std::vector<at::Tensor> saved_;  // the module's own values while swapped in
};

// airbench94's lookahead decay at optimizer step `step` of `total_steps` for an update every `every` steps:
// (base^every) * (step / total_steps)^power, which starts near 0 (the average follows the weights) and
// reaches base^every at the end (strong averaging). airbench: base 0.95, every 5, power 3.
double airbench_lookahead_decay(int64_t step, int64_t total_steps, double base = 0.95, int64_t every = 5,
                                double power = 3.0);

}  // namespace cohort::optim

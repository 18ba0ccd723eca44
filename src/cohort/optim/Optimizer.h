// The optimizers cohort trains with, behind one interface so a strategy can own one without knowing
// which: SGD (momentum, Nesterov) and AdamW, each with torch.optim's update rule. State is keyed by
// parameter name ("momentum_buffer.<name>", "exp_avg.<name>"), so it saves and loads by name, and a
// sharded strategy can hand it views of its slice of each parameter under the same names.
//
//   auto opt = cohort::optim::make_optimizer(cfg.optim, cohort::optim::split_decay(net->named_parameters(), 5e-4,
//   false)); loss.backward(); opt->step(lr); opt->zero_grad();
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/ordered_dict.h>

#include "cohort/config/Config.h"

namespace cohort::optim {

struct ParamGroup {
  std::vector<std::string> names;
  std::vector<at::Tensor> params;
  double weight_decay = 0;
  double lr_scale = 1.0;  // this group's learning rate is the schedule's times this
};

using NamedState = std::vector<std::pair<std::string, at::Tensor>>;

// How parameters are grouped. Batch-norm weights and all biases (every parameter of dimension <= 1) get
// no weight decay unless `decay_all`, as the ResNet training recipes do. With norm_lr_scale != 1, every
// parameter whose name contains "norm" forms a third group with learning rate x norm_lr_scale and weight
// decay / norm_lr_scale, so its decay per step stays the others' (airbench's 64x BatchNorm-bias rate).
struct GroupRule {
  double weight_decay = 0;
  bool decay_all = false;
  double norm_lr_scale = 1.0;
};
// The (possibly empty) groups of `rule`, and which of them a parameter of this name and rank joins.
std::vector<ParamGroup> make_groups(const GroupRule& rule);
size_t group_index(const std::string& name, int64_t dim, const GroupRule& rule);
// make_groups + group_index over `named` (parameters that require grad), empty groups dropped.
std::vector<ParamGroup> split_groups(const torch::OrderedDict<std::string, at::Tensor>& named, const GroupRule& rule);
std::vector<ParamGroup> split_decay(const torch::OrderedDict<std::string, at::Tensor>& named, double weight_decay,
                                    bool decay_all);

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual std::string name() const = 0;
  // One update with learning rate `lr`; parameters without a gradient are left alone.
  void step(double lr);
  // step() in pieces, for an optimizer stepped bucket by bucket during backward (optim.in_backward):
  // begin_step() once per step (AdamW counts its steps there), then update() for each set of parameters,
  // each parameter at most once per step. `which[g]` lists indices into groups()[g].params. Each parameter
  // gets exactly the update step() would give it.
  virtual void begin_step() {}
  // This step's momentum: SGD's momentum, AdamW's beta1 (what OneCycleLR cycles; Schedule::momentum).
  // Stays until set again. A negative value (Schedule::momentum when not cycling) keeps the current one.
  void set_momentum(double momentum) {
    if (momentum >= 0) use_momentum(momentum);
  }
  void update(double lr, const std::vector<std::vector<size_t>>& which);
  void zero_grad();
  // The parameter (by name) is no longer updated and its state no longer advances, as if it stopped
  // requiring grad in PyTorch (airbench freezes its whitening bias after 3 epochs).
  void freeze(const std::string& name);
  // Per-parameter state as "<kind>.<param name>" tensors of the parameter's shape, plus optimizer-wide
  // scalars under their bare name ("step"). Parameters without state yet are absent.
  virtual NamedState state_dict() const = 0;
  // Throws CheckpointError naming a tensor that matches no parameter or has the wrong shape.
  virtual void load_state_dict(const NamedState& state) = 0;
  // The per-parameter state kinds, in a fixed order ("momentum_buffer"; "exp_avg", "exp_avg_sq").
  virtual std::vector<std::string> state_kinds() const = 0;
  // Bytes of optimizer state held now.
  int64_t state_bytes() const;

  const std::vector<ParamGroup>& groups() const { return groups_; }

 protected:
  explicit Optimizer(std::vector<ParamGroup> groups);
  // Finds (group, index) of "<kind>.<name>" for load_state_dict; throws CheckpointError when absent.
  std::pair<size_t, size_t> locate(const std::string& key, const std::string& kind) const;
  void check_shape(const std::string& key, const at::Tensor& t, const at::Tensor& p) const;
  bool frozen(size_t group, size_t index) const { return frozen_[group][index]; }
  // One update of the parameters `live` of group `group` (each with a gradient, not frozen), at that
  // group's learning rate `lr`: what each optimizer implements.
  virtual void update_group(size_t group, double lr, const std::vector<size_t>& live) = 0;
  virtual void use_momentum(double momentum) = 0;
  // Those of `which` (indices into group `group`) that a step moves: with a gradient, not frozen.
  std::vector<size_t> live(size_t group, const std::vector<size_t>& which) const;

  std::vector<ParamGroup> groups_;
  std::vector<std::vector<bool>> frozen_;
};

// optim.foreach resolved for these parameters: "auto" is on where they are on CUDA (Note [One call per
// operation per group] in Sgd.cpp).
bool use_foreach(const std::string& setting, const std::vector<ParamGroup>& groups);
std::unique_ptr<Optimizer> make_optimizer(const OptimConfig& cfg, std::vector<ParamGroup> groups);

}  // namespace cohort::optim

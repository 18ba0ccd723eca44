// SGD with momentum and Nesterov, torch.optim.SGD's update rule (dampening 0).
//
//   cohort::optim::Sgd opt(cohort::optim::split_decay(net->named_parameters(), 5e-4, false), {.momentum = 0.9});
//   loss.backward(); opt.step(lr); opt.zero_grad();
#pragma once

#include "cohort/optim/Optimizer.h"

namespace cohort::optim {

struct SgdOptions {
  double momentum = 0.9;
  bool nesterov = false;
  // Multi-tensor update: one at::_foreach_* call per operation per group instead of one per parameter
  // (Note [One call per operation per group]).
  bool foreach = false;
};

class Sgd : public Optimizer {
 public:
  Sgd(std::vector<ParamGroup> groups, SgdOptions options);

  std::string name() const override { return "sgd"; }
  // p -= lr * update, with update as torch.optim.SGD computes it.
  void update_group(size_t group, double lr, const std::vector<size_t>& live) override;
  void use_momentum(double momentum) override { options_.momentum = momentum; }
  // Momentum buffers as "momentum_buffer.<param name>".
  NamedState state_dict() const override;
  void load_state_dict(const NamedState& state) override;
  std::vector<std::string> state_kinds() const override { return {"momentum_buffer"}; }

 private:
  void step_each(size_t group, double lr, const std::vector<size_t>& live);
  void step_foreach(size_t group, double lr, const std::vector<size_t>& live);

  SgdOptions options_;
  std::vector<std::vector<at::Tensor>> momentum_;  // per group, per param; undefined until first step
};

// AdamW as torch.optim.AdamW (amsgrad off): decoupled weight decay p *= 1 - lr * wd, bias-corrected
// moments. One step count for the whole optimizer ("step"), since every parameter steps together.
struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  bool foreach = false;  // as SgdOptions::foreach
};

class AdamW : public Optimizer {
 public:
  AdamW(std::vector<ParamGroup> groups, AdamWOptions options);

  std::string name() const override { return "adamw"; }
  void begin_step() override;
  void use_momentum(double beta1) override { options_.beta1 = beta1; }
  void update_group(size_t group, double lr, const std::vector<size_t>& live) override;
  // "exp_avg.<name>", "exp_avg_sq.<name>" and the scalar "step".
  NamedState state_dict() const override;
  void load_state_dict(const NamedState& state) override;
  std::vector<std::string> state_kinds() const override { return {"exp_avg", "exp_avg_sq"}; }
  int64_t steps() const { return step_; }

 private:
  // One update of parameters `live` of group `group`, with this step's bias corrections.
  void step_each(size_t group, double lr, const std::vector<size_t>& live);
  void step_foreach(size_t group, double lr, const std::vector<size_t>& live);

  AdamWOptions options_;
  int64_t step_ = 0;
  double bias1_ = 1, bias2_sqrt_ = 1;  // 1 - beta1^step and sqrt(1 - beta2^step), set by begin_step()
  std::vector<std::vector<at::Tensor>> exp_avg_, exp_avg_sq_;
};

}  // namespace cohort::optim

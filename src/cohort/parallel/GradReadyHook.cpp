#include "cohort/parallel/GradReadyHook.h"

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/variable.h>

namespace cohort::parallel {
namespace {

class GradReadyHook : public torch::autograd::FunctionPostHook {
 public:
  GradReadyHook(std::weak_ptr<std::function<void(size_t)>> fire, size_t index)
      : fire_(std::move(fire)), index_(index) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    if (auto f = fire_.lock()) (*f)(index_);
    return outputs;
  }

 private:
  std::weak_ptr<std::function<void(size_t)>> fire_;
  size_t index_;
};

}  // namespace

std::vector<std::shared_ptr<void>> attach_grad_ready_hooks(const std::vector<at::Tensor>& params,
                                                           std::weak_ptr<std::function<void(size_t)>> fire) {
  std::vector<std::shared_ptr<void>> accumulators;
  for (size_t i = 0; i < params.size(); ++i) {
    auto acc = torch::autograd::impl::grad_accumulator(params[i]);
    acc->add_post_hook(std::make_unique<GradReadyHook>(fire, i));
    // Autograd holds the accumulator weakly: this strong reference keeps it, and the hook, alive. It is a
    // std::shared_ptr<Node> in LibTorch 1.13 and 2.6 and a c10::intrusive_ptr<Node> in 2.14; holding a copy
    // of whichever it is works for both.
    accumulators.push_back(std::make_shared<decltype(acc)>(std::move(acc)));
  }
  return accumulators;
}

}  // namespace cohort::parallel

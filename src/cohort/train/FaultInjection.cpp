#include "cohort/train/FaultInjection.h"

#include <cmath>
#include <cstdlib>
#include <limits>
#include <sstream>
#include <string>

namespace cohort::train {

std::set<int64_t> fault_steps_from_env(const char* name) {
  std::set<int64_t> out;
  const char* text = std::getenv(name);
  if (!text) return out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) out.insert(std::atoll(item.c_str()));
  return out;
}

void poison_gradient(torch::nn::Module& model, int64_t step) {
  at::NoGradGuard no_grad;
  for (auto& p : model.parameters())
    if (p.grad().defined()) {
      p.grad().view(-1)[0].fill_(step % 2 ? std::numeric_limits<double>::infinity() : std::nan(""));
      return;
    }
}

}  // namespace cohort::train

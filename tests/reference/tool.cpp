// What the reference tests (tests/reference/*.py) ask of cohort's library directly:
//
//   cohort_reference_tool sampler < cases.jsonl
//       for each line {"n", "world", "seed", "epoch", "shuffle", "drop_last"}: one line, every rank's
//       DistributedSampler indices for that epoch, [[rank 0's], [rank 1's], ...]
//   cohort_reference_tool safetensors-copy IN OUT
//       IN read by cohort's safetensors reader and written again by its writer, metadata included
//   cohort_reference_tool preprocess OUT FILE... [key=value ...]
//       `cohort predict`'s evaluation transform of each JPEG FILE for the config's model and data, stacked
//       into the tensor "images" of OUT (safetensors)
#include <cstdlib>
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include <torch/torch.h>

#include "cohort/checkpoint/Safetensors.h"
#include "cohort/config/Config.h"
#include "cohort/data/DistributedSampler.h"
#include "cohort/train/Predict.h"

namespace {

int sampler() {
  std::string line;
  while (std::getline(std::cin, line)) {
    const auto c = nlohmann::json::parse(line);
    nlohmann::json ranks = nlohmann::json::array();
    for (int r = 0; r < c.at("world").get<int>(); ++r) {
      const cohort::data::DistributedSampler s(c.at("n").get<int64_t>(), c.at("world").get<int>(), r,
                                               c.at("shuffle").get<bool>(), c.at("seed").get<uint64_t>(),
                                               c.at("drop_last").get<bool>());
      ranks.push_back(s.indices(c.at("epoch").get<int64_t>()));
    }
    std::cout << ranks.dump() << "\n";
  }
  return 0;
}

int safetensors_copy(const std::string& in, const std::string& out) {
  const auto f = cohort::checkpoint::load_safetensors(in);
  cohort::checkpoint::save_safetensors(out, f.tensors, f.metadata);
  return 0;
}

int preprocess(const std::string& out, int n, char** words) {
  std::vector<std::string> overrides;
  std::vector<at::Tensor> images;
  for (int i = 0; i < n; ++i)
    if (std::string(words[i]).find('=') != std::string::npos) overrides.push_back(words[i]);
  const auto cfg = cohort::config::load(std::nullopt, overrides);
  for (int i = 0; i < n; ++i)
    if (std::string(words[i]).find('=') == std::string::npos)
      images.push_back(cohort::train::preprocess_image(cfg, words[i]));
  cohort::checkpoint::save_safetensors(out, {{"images", torch::stack(images)}});
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string what = argc > 1 ? argv[1] : "";
  try {
    if (what == "sampler" && argc == 2) return sampler();
    if (what == "safetensors-copy" && argc == 4) return safetensors_copy(argv[2], argv[3]);
    if (what == "preprocess" && argc >= 4) return preprocess(argv[2], argc - 3, argv + 3);
  } catch (const std::exception& e) {
    std::cerr << "cohort_reference_tool: " << e.what() << "\n";
    return 1;
  }
  std::cerr << "usage: cohort_reference_tool sampler < cases.jsonl\n"
               "       cohort_reference_tool safetensors-copy IN OUT\n"
               "       cohort_reference_tool preprocess OUT FILE... [key=value ...]\n";
  return 2;
}

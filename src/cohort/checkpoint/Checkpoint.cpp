#include "cohort/checkpoint/Checkpoint.h"

#include <cmath>
#include <map>

#include <ATen/core/grad_mode.h>
#include <nlohmann/json.hpp>

#include "cohort/checkpoint/Names.h"
#include "cohort/checkpoint/ShardedCheckpoint.h"
#include "cohort/checkpoint/Steps.h"
#include "cohort/util/Error.h"

namespace cohort::checkpoint {
namespace fs = std::filesystem;
namespace {

std::map<std::string, std::string> format_metadata(const std::string& format, const TrainState& s) {
  return {{"cohort.format", format},
          {"cohort.version", std::to_string(kCheckpointVersion)},
          {"step", std::to_string(s.step)},
          {"epoch", std::to_string(s.epoch)}};
}

std::string need(const SafetensorsFile& f, const std::string& key, const std::string& source) {
  auto it = f.metadata.find(key);
  if (it == f.metadata.end())
    throw CheckpointError(source + " lacks the '" + key + "' metadata entry",
                          "it was not written by cohort; resume from a cohort run directory");
  return it->second;
}

int64_t to_i64(const std::string& text, const std::string& key, const std::string& source) {
  try {
    size_t used = 0;
    const long long v = std::stoll(text, &used);
    if (used == text.size()) return v;
  } catch (const std::exception&) {
  }
  throw CheckpointError(source + ": metadata '" + key + "' = '" + text + "' is not an integer",
                        "the file is damaged; resume from an earlier checkpoint");
}

// std::stod alone would throw std::invalid_argument, which names neither the file nor the key, and would
// accept "0.5abc".
double to_f64(const std::string& text, const std::string& key, const std::string& source) {
  try {
    size_t used = 0;
    const double v = std::stod(text, &used);
    if (used == text.size()) return v;
  } catch (const std::exception&) {
  }
  throw CheckpointError(source + ": metadata '" + key + "' = '" + text + "' is not a number",
                        "the file is damaged; resume from an earlier checkpoint");
}

// Note [Checkpoint format versions] in Checkpoint.h: a newer major version is refused, saying so.
void check_version(const SafetensorsFile& f, const std::string& format, const std::string& source) {
  if (need(f, "cohort.format", source) != format)
    throw CheckpointError(source + " is a '" + need(f, "cohort.format", source) + "' file, expected '" + format + "'",
                          "pass the run directory, not a single file");
  const auto v = to_i64(need(f, "cohort.version", source), "cohort.version", source);
  if (v > kCheckpointVersion)
    throw CheckpointError(source + " has checkpoint version " + std::to_string(v) + "; this cohort reads up to " +
                              std::to_string(kCheckpointVersion),
                          "resume with the newer cohort that wrote it");
}

}  // namespace

NamedTensors model_state(const torch::nn::Module& module) {
  NamedTensors out;
  for (const auto& p : module.named_parameters(true)) out.emplace_back(p.key(), p.value().detach());
  for (const auto& b : module.named_buffers(true)) out.emplace_back(b.key(), b.value().detach());
  return out;
}

void save(const fs::path& dir, const std::string& tag, const torch::nn::Module& module,
          const NamedTensors& optimizer_state, const TrainState& state) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    throw CheckpointError("cannot create checkpoint directory " + dir.string() + ": " + ec.message(),
                          "check run.dir is writable and the disk has space");
  // The weights go first: if we crash between the two renames, load() sees differing steps and says so,
  // and the previous pair is only ever replaced file by file, never truncated.
  save_safetensors(dir / names::weights_file(tag), model_state(module), format_metadata("cohort-model", state));
  auto meta = format_metadata("cohort-train-state", state);
  meta["best_test_accuracy"] = std::to_string(state.best_test_accuracy);
  meta["world_size"] = std::to_string(state.world_size);
  meta["config"] = state.config_json;
  if (state.loss_scale > 0) meta["amp_scaler"] = scaler_json(state);
  save_safetensors(dir / names::state_file(tag), optimizer_state, meta);
  remove_sharded(dir, tag);  // a sharded save of this tag from a run resumed under ddp is stale now
}

TrainState parse_train_state(const SafetensorsFile& file, const std::string& source) {
  check_version(file, "cohort-train-state", source);
  TrainState s;
  s.step = to_i64(need(file, "step", source), "step", source);
  s.epoch = to_i64(need(file, "epoch", source), "epoch", source);
  s.world_size = to_i64(need(file, "world_size", source), "world_size", source);
  s.best_test_accuracy = to_f64(need(file, "best_test_accuracy", source), "best_test_accuracy", source);
  s.config_json = need(file, "config", source);
  if (auto it = file.metadata.find("amp_scaler"); it != file.metadata.end()) parse_scaler_json(it->second, s, source);
  return s;
}

std::string scaler_json(const TrainState& s) {
  return nlohmann::json{
      {"scale", s.loss_scale}, {"growth_tracker", s.loss_scale_growth_tracker}, {"skipped_steps", s.skipped_steps}}
      .dump();
}

void parse_scaler_json(const std::string& text, TrainState& s, const std::string& source) {
  try {
    const auto j = nlohmann::json::parse(text);
    const double scale = j.at("scale").get<double>();
    const auto tracker = j.at("growth_tracker").get<int64_t>();
    const auto skipped = j.at("skipped_steps").get<int64_t>();
    if (!(scale > 0 && std::isfinite(scale)) || tracker < 0 || skipped < 0)
      throw std::out_of_range("value out of range");
    s.loss_scale = scale;
    s.loss_scale_growth_tracker = tracker;
    s.skipped_steps = skipped;
  } catch (const std::exception& e) {
    throw CheckpointError(source + ": the loss-scaler entry 'amp_scaler' is damaged (" + std::string(e.what()) + ")",
                          "resume from an older checkpoint");
  }
}

void export_weights(const Checkpoint& ck, const fs::path& out) {
  save_safetensors(out, ck.model, format_metadata("cohort-model", ck.state));
}

Checkpoint load(const fs::path& dir, const std::string& tag) {
  const fs::path model_path = dir / names::weights_file(tag);
  const fs::path state_path = dir / names::state_file(tag);
  for (const auto& p : {model_path, state_path})
    if (!fs::exists(p))
      throw CheckpointError("checkpoint file " + p.string() + " does not exist",
                            "resume from a run directory whose checkpoints/ holds " + tag + ".safetensors and " + tag +
                                ".state.safetensors");
  Checkpoint ck;
  auto model = load_safetensors(model_path);
  auto state = load_safetensors(state_path);
  check_version(model, "cohort-model", model_path.string());
  ck.state = parse_train_state(state, state_path.string());
  ck.model = std::move(model.tensors);
  ck.optimizer = std::move(state.tensors);
  const auto model_step = to_i64(need(model, "step", model_path.string()), "step", model_path.string());
  if (model_step != ck.state.step)
    throw CheckpointError(model_path.string() + " is from step " + std::to_string(model_step) + " but " +
                              state_path.string() + " is from step " + std::to_string(ck.state.step),
                          "a save was interrupted between the two files; resume from best or an earlier copy");
  return ck;
}

fs::path resolve_resume_dir(const fs::path& path) {
  if (fs::exists(path / names::kCheckpointsDir)) return path / names::kCheckpointsDir;
  if (fs::exists(path / names::weights_file(names::kLast)) || fs::exists(path / names::manifest_file(names::kLast)) ||
      !list_step_dirs(path).empty())
    return path;
  throw CheckpointError("nothing to resume in '" + path.string() + "': no checkpoints/ directory or last.safetensors",
                        "pass the run directory of an earlier `cohort train` (it holds checkpoints/)");
}

std::vector<std::string> load_weights(torch::nn::Module& module, const NamedTensors& tensors, const std::string& source,
                                      const std::vector<std::string>& replaceable) {
  std::map<std::string, at::Tensor> own;
  for (const auto& p : module.named_parameters(true)) own[p.key()] = p.value();
  for (const auto& b : module.named_buffers(true)) own[b.key()] = b.value();
  std::vector<std::string> unexpected, mismatched, replaced;
  std::map<std::string, const at::Tensor*> given;
  for (const auto& [name, t] : tensors) {
    auto it = own.find(name);
    if (it == own.end())
      unexpected.push_back(name);
    else if (it->second.sizes() != t.sizes() &&
             std::find(replaceable.begin(), replaceable.end(), name) != replaceable.end())
      replaced.push_back(name);  // a new head: keep the model's freshly initialized tensor
    else if (it->second.sizes() != t.sizes())
      mismatched.push_back(name + " (file " + c10::str(t.sizes()) + ", model " + c10::str(it->second.sizes()) + ")");
    else
      given[name] = &t;
  }
  std::vector<std::string> missing;
  for (const auto& entry : own) {
    // Not a structured binding: clang before 16 cannot capture one in the lambda (a C++20 feature).
    const std::string& name = entry.first;
    if (!given.count(name) && std::find(replaced.begin(), replaced.end(), name) == replaced.end() &&
        std::none_of(mismatched.begin(), mismatched.end(),
                     [&](const std::string& m) { return m.rfind(name + " ", 0) == 0; }))
      missing.push_back(name);
  }
  if (!unexpected.empty() || !missing.empty() || !mismatched.empty()) {
    auto join = [](const std::vector<std::string>& v) {
      std::string s;
      for (size_t i = 0; i < v.size() && i < 8; ++i) s += (i ? ", " : "") + v[i];
      if (v.size() > 8) s += ", ... (" + std::to_string(v.size()) + " in all)";
      return s.empty() ? std::string("none") : s;
    };
    throw CheckpointError("weights in " + source + " do not fit the model: missing: " + join(missing) +
                              "; unexpected: " + join(unexpected) + "; mismatched: " + join(mismatched),
                          "use the model.name, model.width and model.num_classes the weights were saved with");
  }
  at::NoGradGuard no_grad;
  for (auto& [name, t] : own)
    if (given.count(name)) t.copy_(given[name]->to(t.options()));
  return replaced;
}

}  // namespace cohort::checkpoint

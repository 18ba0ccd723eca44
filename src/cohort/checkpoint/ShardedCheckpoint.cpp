#include "cohort/checkpoint/ShardedCheckpoint.h"

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "cohort/checkpoint/Names.h"
#include "cohort/checkpoint/Steps.h"
#include "cohort/util/AtomicFile.h"
#include "cohort/util/Error.h"

namespace cohort::checkpoint {
namespace fs = std::filesystem;
namespace {

fs::path manifest_path(const fs::path& dir, const std::string& tag) { return dir / names::manifest_file(tag); }
fs::path commit_path(const fs::path& dir, const std::string& tag) { return dir / names::commit_file(tag); }
std::string shard_file_name(const std::string& tag, int rank, int world) { return names::shard_file(tag, rank, world); }

std::string read_text(const fs::path& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  if (in) text << in.rdbuf();
  if (!in || in.bad())
    throw CheckpointError(what + " " + path.string() + " does not exist or cannot be read",
                          "resume from a checkpoint directory whose save completed");
  return text.str();
}

nlohmann::json parse_json(std::string_view text, const std::string& source, const std::string& what) {
  try {
    return nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    throw CheckpointError(what + " " + source + " is not valid JSON: " + e.what(),
                          "the file is damaged; resume from another checkpoint (best, or an earlier copy)");
  }
}

// A manifest field of the wrong type or out of range. parse_manifest reports it like nlohmann's own
// errors (a missing key, a string where a list belongs), as "incomplete" or "malformed".
struct BadField : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::string shown(const nlohmann::json& v) {
  std::string s = v.dump();
  return s.size() > 40 ? s.substr(0, 40) + "..." : s;
}

// nlohmann's get<int64_t>() converts a float with a plain cast (undefined behaviour for 1e300) and wraps
// integers above INT64_MAX, so integers from a file are checked by hand.
bool as_i64(const nlohmann::json& v, int64_t& out) {
  if (v.is_number_unsigned()) {
    const auto u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) return false;
    out = static_cast<int64_t>(u);
    return true;
  }
  if (!v.is_number_integer()) return false;
  out = v.get<int64_t>();
  return true;
}

int64_t int_at(const nlohmann::json& obj, const std::string& key) {
  const auto& v = obj.at(key);  // nlohmann names a missing key
  int64_t out = 0;
  if (!as_i64(v, out)) throw BadField("'" + key + "' must be an integer, got " + shown(v));
  return out;
}

int64_t non_negative_at(const nlohmann::json& obj, const std::string& key) {
  const int64_t v = int_at(obj, key);
  if (v < 0) throw BadField("'" + key + "' must not be negative, got " + std::to_string(v));
  return v;
}

const nlohmann::json& array_at(const nlohmann::json& obj, const std::string& key) {
  const auto& v = obj.at(key);
  if (!v.is_array()) throw BadField("'" + key + "' must be a list, got " + shown(v));
  return v;
}

std::string meta(const SafetensorsFile& f, const std::string& key, const fs::path& path) {
  auto it = f.metadata.find(key);
  if (it == f.metadata.end())
    throw CheckpointError("shard " + path.string() + " lacks the '" + key + "' metadata entry",
                          "it was not written by cohort's sharded save");
  return it->second;
}

}  // namespace

bool has_sharded(const fs::path& dir, const std::string& tag) { return fs::exists(manifest_path(dir, tag)); }

void remove_sharded(const fs::path& dir, const std::string& tag) {
  std::error_code ec;
  fs::remove(commit_path(dir, tag), ec);
  fs::remove(manifest_path(dir, tag), ec);
  if (!fs::exists(dir)) return;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const auto name = e.path().filename().string();
    if (name.rfind(names::shard_file_prefix(tag), 0) == 0) fs::remove(e.path(), ec);
  }
}

namespace {

// This rank's tensors under their names in the shard file.
NamedTensors shard_tensors(const ShardedSave& save) {
  NamedTensors out;
  for (size_t u = 0; u < save.params.size(); ++u) {
    out.emplace_back(names::shard_param(u), save.params[u]);
    for (const auto& kind : save.layout.kinds) out.emplace_back(names::shard_state(kind, u), save.state.at(kind).at(u));
  }
  if (save.optimizer_step.defined()) out.emplace_back(names::kOptimizerStep, save.optimizer_step);
  for (const auto& [name, t] : save.buffers) out.emplace_back(names::kShardBufferPrefix + name, t);
  return out;
}

nlohmann::json manifest_json(const ShardLayout& layout, const std::string& tag, const TrainState& state, int world) {
  nlohmann::json units = nlohmann::json::array();
  for (const auto& unit : layout.units) {
    nlohmann::json ps = nlohmann::json::array();
    for (const auto& p : unit.params) ps.push_back({{"name", p.name}, {"shape", p.shape}, {"offset", p.offset}});
    units.push_back({{"numel", unit.numel}, {"padded", unit.padded}, {"shard", unit.shard}, {"params", ps}});
  }
  nlohmann::json m = {{"strategy", layout.strategy},
                      {"optimizer", layout.optimizer},
                      {"kinds", layout.kinds},
                      {"buffers", layout.buffers},
                      {"units", units}};
  m["format"] = "cohort-sharded";
  m["version"] = kCheckpointVersion;
  m["tag"] = tag;
  m["step"] = state.step;
  m["epoch"] = state.epoch;
  m["best_test_accuracy"] = state.best_test_accuracy;
  m["world_size"] = world;
  m["config"] = state.config_json;
  if (state.loss_scale > 0) m["amp_scaler"] = scaler_json(state);
  nlohmann::json files = nlohmann::json::array();
  for (int r = 0; r < world; ++r) files.push_back(shard_file_name(tag, r, world));
  m["files"] = files;
  return m;
}

// Slices of an earlier save at another world size, and an unsharded save of the same tag, are stale now.
void remove_stale(const fs::path& dir, const std::string& tag, int world) {
  std::error_code ec;
  const auto ours = shard_file_name(tag, 0, world);
  const auto suffix = ours.substr(ours.find("-of-"));  // "-of-00004.safetensors"
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const auto name = e.path().filename().string();
    const bool stale =
        name.rfind(names::shard_file_prefix(tag), 0) == 0 &&
        (name.size() < suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0);
    if (stale) fs::remove(e.path(), ec);
  }
  fs::remove(dir / names::weights_file(tag), ec);
  fs::remove(dir / names::state_file(tag), ec);
}

}  // namespace

void save_sharded(const fs::path& dir, const std::string& tag, const ShardedSave& save, const TrainState& state,
                  comm::Communicator& comm, CommitBy commit) {
  const int rank = comm.rank(), world = comm.size();
  if (rank == 0) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec)
      throw CheckpointError("cannot create checkpoint directory " + dir.string() + ": " + ec.message(),
                            "check run.dir is writable and the disk has space");
    // The marker goes first: from here until the new one is written, this tag is incomplete on disk.
    fs::remove(commit_path(dir, tag), ec);
  }
  comm.barrier("checkpoint " + tag + ": begin")->wait();
  save_safetensors(dir / shard_file_name(tag, rank, world), shard_tensors(save),
                   {{"cohort.format", "cohort-shard"},
                    {"cohort.version", std::to_string(kCheckpointVersion)},
                    {"step", std::to_string(state.step)},
                    {"rank", std::to_string(rank)},
                    {"world_size", std::to_string(world)}});
  if (rank == 0)
    util::write_file_atomic(manifest_path(dir, tag), manifest_json(save.layout, tag, state, world).dump(1) + "\n");
  comm.barrier("checkpoint " + tag + ": shards written")->wait();
  if (rank != 0) return;
  if (commit == CommitBy::kMarkerFile)
    util::write_file_atomic(commit_path(dir, tag),
                            nlohmann::json{{"step", state.step}, {"world_size", world}}.dump() + "\n");
  remove_stale(dir, tag, world);
}

ShardedManifest parse_manifest(std::string_view text, const std::string& source) {
  const auto m = parse_json(text, source, "checkpoint manifest");
  ShardedManifest out;
  try {
    out.state.step = int_at(m, "step");
    out.state.epoch = int_at(m, "epoch");
    out.state.best_test_accuracy = m.at("best_test_accuracy").get<double>();
    out.state.world_size = int_at(m, "world_size");
    out.state.config_json = m.at("config").get<std::string>();
    if (m.contains("amp_scaler")) parse_scaler_json(m.at("amp_scaler").get<std::string>(), out.state, source);
    out.version = m.contains("version") ? int_at(m, "version") : 0;
    if (m.contains("strategy")) out.layout.strategy = m.at("strategy").get<std::string>();
    if (m.contains("optimizer")) out.layout.optimizer = m.at("optimizer").get<std::string>();
  } catch (const std::exception& e) {  // nlohmann::json::exception or BadField
    throw CheckpointError("checkpoint manifest " + source + " is incomplete: " + e.what(),
                          "the file is damaged; resume from another checkpoint");
  }
  if (out.version > kCheckpointVersion)
    throw CheckpointError(source + " has checkpoint version " + std::to_string(out.version) +
                              "; this cohort reads up to " + std::to_string(kCheckpointVersion),
                          "resume with the newer cohort that wrote it");
  // load_sharded keeps one map of tensors per rank: a corrupt count must not size that.
  const int64_t world = out.state.world_size;
  if (world < 1 || world > kShardedMaxWorld)
    throw CheckpointError("checkpoint manifest " + source + " says world_size " + std::to_string(world) +
                              ", outside 1.." + std::to_string(kShardedMaxWorld),
                          "the file is damaged; resume from another checkpoint");
  try {
    out.layout.kinds = m.at("kinds").get<std::vector<std::string>>();
    const auto& units = array_at(m, "units");
    for (size_t u = 0; u < units.size(); ++u) {
      const auto& unit = units[u];
      ShardLayout::Unit parsed;
      parsed.shard = non_negative_at(unit, "shard");
      // Every offset is checked against shard x world below, so that product must not overflow.
      if (parsed.shard > INT64_MAX / world)
        throw BadField("unit " + std::to_string(u) + ": 'shard' " + std::to_string(parsed.shard) + " x world_size " +
                       std::to_string(world) + " overflows");
      const int64_t unit_numel = parsed.shard * world;
      for (const auto& p : array_at(unit, "params")) {
        ShardLayout::Param param;
        param.name = p.at("name").get<std::string>();
        param.numel = 1;
        for (const auto& d : array_at(p, "shape")) {
          int64_t dim = 0;
          if (!as_i64(d, dim) || dim < 0 || (dim > 0 && param.numel > INT64_MAX / dim))
            throw BadField("parameter '" + param.name + "': shape " + shown(p.at("shape")) +
                           " must be non-negative integers whose product fits in 64 bits");
          param.shape.push_back(dim);
          param.numel *= dim;
        }
        param.offset = non_negative_at(p, "offset");
        if (param.offset > unit_numel || param.numel > unit_numel - param.offset)
          throw CheckpointError(source + ": parameter '" + param.name + "' lies outside its unit",
                                "the manifest is damaged");
        parsed.params.push_back(std::move(param));
      }
      parsed.numel = unit.contains("numel") ? non_negative_at(unit, "numel") : 0;
      parsed.padded = unit.contains("padded") ? non_negative_at(unit, "padded") : unit_numel;
      out.layout.units.push_back(std::move(parsed));
    }
    out.layout.buffers = m.at("buffers").get<std::vector<std::string>>();
  } catch (const CheckpointError&) {
    throw;
  } catch (const std::exception& e) {  // nlohmann::json::exception or BadField
    throw CheckpointError("checkpoint manifest " + source + " is malformed: " + e.what(),
                          "the file is damaged; resume from another checkpoint");
  }
  return out;
}

int64_t parse_commit_step(std::string_view text, const std::string& source) {
  const auto commit = parse_json(text, source, "commit marker");
  if (!commit.is_object())
    throw CheckpointError("commit marker " + source + " is not a JSON object",
                          "the file is damaged; resume from another checkpoint");
  if (!commit.contains("step")) return -1;
  int64_t step = 0;
  if (!as_i64(commit.at("step"), step))
    throw CheckpointError("commit marker " + source + ": 'step' must be an integer, got " + shown(commit.at("step")),
                          "the file is damaged; resume from another checkpoint");
  return step;
}

namespace {

// A sharded save is complete once its one marker exists: <tag>.commit beside it, or the COMMIT of the
// step directory it was saved into (which checkpoint::step_dir_problem checks file by file). Saves by
// cohort 0.1 in step directories have both. Either must name the manifest's step.
void check_committed(const fs::path& dir, const std::string& tag, int64_t step) {
  fs::path cpath = commit_path(dir, tag);
  int64_t committed = -1;
  if (fs::exists(cpath)) {
    committed = parse_commit_step(read_text(cpath, "commit marker"), cpath.string());
  } else if (fs::exists(dir / names::kStepCommit)) {
    cpath = dir / names::kStepCommit;
    committed = parse_commit_marker(read_text(cpath, "commit marker"), cpath.string()).step;
  } else {
    throw CheckpointError("sharded checkpoint '" + tag + "' in " + dir.string() + " has no commit marker (" +
                              cpath.filename().string() + " or " + names::kStepCommit + "): its save did not finish",
                          "resume from another checkpoint (best), or from a copy made before the interrupted save");
  }
  if (committed != step)
    throw CheckpointError(cpath.string() + " is for step " + std::to_string(committed) +
                              " but the manifest is for step " + std::to_string(step),
                          "a save was interrupted; resume from another checkpoint");
}

}  // namespace

Checkpoint load_sharded(const fs::path& dir, const std::string& tag) {
  const auto mpath = manifest_path(dir, tag);
  const ShardedManifest m = parse_manifest(read_text(mpath, "checkpoint manifest"), mpath.string());
  Checkpoint ck;
  ck.state = m.state;
  check_committed(dir, tag, ck.state.step);
  const int world = static_cast<int>(ck.state.world_size);
  std::vector<std::map<std::string, at::Tensor>> shards(world);
  for (int r = 0; r < world; ++r) {
    const auto path = dir / shard_file_name(tag, r, world);
    if (!fs::exists(path))
      throw CheckpointError(
          "shard " + path.string() + " of checkpoint '" + tag + "' (rank " + std::to_string(r) + " of " +
              std::to_string(world) + ") is missing",
          "copy every shard-*-of-" + std::to_string(world) + " file of the run, or resume from another checkpoint");
    auto f = load_safetensors(path);
    if (meta(f, "cohort.format", path) != "cohort-shard" || meta(f, "rank", path) != std::to_string(r) ||
        meta(f, "world_size", path) != std::to_string(world) || meta(f, "step", path) != std::to_string(ck.state.step))
      throw CheckpointError("shard " + path.string() + " does not belong to this checkpoint (it says rank " +
                                meta(f, "rank", path) + " of " + meta(f, "world_size", path) + ", step " +
                                meta(f, "step", path) + "; the manifest expects rank " + std::to_string(r) + " of " +
                                std::to_string(world) + ", step " + std::to_string(ck.state.step) + ")",
                            "the shards come from different saves; resume from another checkpoint");
    for (auto& [name, t] : f.tensors) shards[r][name] = t;
  }
  auto piece = [&](int r, const std::string& name, int64_t numel) -> at::Tensor {
    auto it = shards[r].find(name);
    const auto path = (dir / shard_file_name(tag, r, world)).string();
    if (it == shards[r].end())
      throw CheckpointError("shard " + path + " lacks tensor '" + name + "'",
                            "the shard is damaged or from another model");
    if (it->second.numel() != numel)
      throw CheckpointError("shard " + path + ": tensor '" + name + "' has " + std::to_string(it->second.numel()) +
                                " elements, the manifest says " + std::to_string(numel),
                            "the shard is from another model or world size");
    return it->second.reshape(-1);
  };
  for (size_t u = 0; u < m.layout.units.size(); ++u) {
    const auto& unit = m.layout.units[u];
    auto assemble = [&](const std::string& prefix) {
      std::vector<at::Tensor> parts;
      for (int r = 0; r < world; ++r) parts.push_back(piece(r, names::shard_state(prefix, u), unit.shard));
      return at::cat(parts);
    };
    std::vector<std::pair<std::string, at::Tensor>> flats{{"", assemble(names::kShardParamKind)}};
    for (const auto& kind : m.layout.kinds) flats.emplace_back(kind + ".", assemble(kind));
    for (const auto& p : unit.params) {
      for (const auto& [prefix, flat] : flats) {
        auto t = flat.narrow(0, p.offset, p.numel).view(p.shape).clone();
        (prefix.empty() ? ck.model : ck.optimizer).emplace_back(prefix + p.name, t);
      }
    }
  }
  for (const auto& name : m.layout.buffers) {
    auto it = shards[0].find(names::kShardBufferPrefix + name);
    if (it == shards[0].end())
      throw CheckpointError("shard " + (dir / shard_file_name(tag, 0, world)).string() + " lacks buffer '" + name + "'",
                            "the shard is damaged");
    ck.model.emplace_back(name, it->second);
  }
  if (auto it = shards[0].find(names::kOptimizerStep); it != shards[0].end())
    ck.optimizer.emplace_back(names::kOptimizerStep, it->second);
  return ck;
}

Checkpoint load_any(const fs::path& dir, const std::string& tag) {
  return has_sharded(dir, tag) ? load_sharded(dir, tag) : load(dir, tag);
}

}  // namespace cohort::checkpoint

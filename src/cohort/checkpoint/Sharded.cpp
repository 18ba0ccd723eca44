#include "cohort/checkpoint/Sharded.h"

#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

#include "cohort/util/AtomicFile.h"
#include "cohort/util/Error.h"

namespace cohort::checkpoint {
namespace fs = std::filesystem;
namespace {

fs::path manifest_path(const fs::path& dir, const std::string& tag) { return dir / (tag + ".manifest.json"); }
fs::path commit_path(const fs::path& dir, const std::string& tag) { return dir / (tag + ".commit"); }

nlohmann::json read_json(const fs::path& path, const std::string& what) {
  std::ifstream in(path);
  if (!in)
    throw CheckpointError(what + " " + path.string() + " does not exist or cannot be read",
                          "resume from a checkpoint directory whose save completed");
  try {
    return nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    throw CheckpointError(what + " " + path.string() + " is not valid JSON: " + e.what(),
                          "the file is damaged; resume from another checkpoint (best, or an earlier copy)");
  }
}

std::string meta(const SafetensorsFile& f, const std::string& key, const fs::path& path) {
  auto it = f.metadata.find(key);
  if (it == f.metadata.end())
    throw CheckpointError("shard " + path.string() + " lacks the '" + key + "' metadata entry",
                          "it was not written by cohort's sharded save");
  return it->second;
}

}  // namespace

std::string shard_file_name(const std::string& tag, int rank, int world) {
  char buf[64];
  std::snprintf(buf, sizeof buf, ".shard-%05d-of-%05d.safetensors", rank, world);
  return tag + buf;
}

bool has_sharded(const fs::path& dir, const std::string& tag) { return fs::exists(manifest_path(dir, tag)); }

void remove_sharded(const fs::path& dir, const std::string& tag) {
  std::error_code ec;
  fs::remove(commit_path(dir, tag), ec);
  fs::remove(manifest_path(dir, tag), ec);
  if (!fs::exists(dir)) return;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const auto name = e.path().filename().string();
    if (name.rfind(tag + ".shard-", 0) == 0) fs::remove(e.path(), ec);
  }
}

void save_sharded(const fs::path& dir, const std::string& tag, const NamedTensors& tensors,
                  const nlohmann::json& layout, const TrainState& state, Communicator& comm) {
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
  save_safetensors(dir / shard_file_name(tag, rank, world), tensors,
                   {{"cohort.format", "cohort-shard"},
                    {"cohort.version", std::to_string(kCheckpointVersion)},
                    {"step", std::to_string(state.step)},
                    {"rank", std::to_string(rank)},
                    {"world_size", std::to_string(world)}});
  if (rank == 0) {
    nlohmann::json m = layout;
    m["format"] = "cohort-sharded";
    m["version"] = kCheckpointVersion;
    m["tag"] = tag;
    m["step"] = state.step;
    m["epoch"] = state.epoch;
    m["best_test_accuracy"] = state.best_test_accuracy;
    m["world_size"] = world;
    m["config"] = state.config_json;
    nlohmann::json files = nlohmann::json::array();
    for (int r = 0; r < world; ++r) files.push_back(shard_file_name(tag, r, world));
    m["files"] = files;
    util::write_file_atomic(manifest_path(dir, tag), m.dump(1) + "\n");
  }
  comm.barrier("checkpoint " + tag + ": shards written")->wait();
  if (rank == 0) {
    util::write_file_atomic(commit_path(dir, tag),
                            nlohmann::json{{"step", state.step}, {"world_size", world}}.dump() + "\n");
    // Slices of an earlier save at another world size, and an unsharded save of the same tag, are stale now.
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      const auto name = e.path().filename().string();
      const auto ours = shard_file_name(tag, 0, world);
      const auto suffix = ours.substr(ours.find("-of-"));  // "-of-00004.safetensors"
      const bool stale = name.rfind(tag + ".shard-", 0) == 0 &&
                         (name.size() < suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0);
      if (stale) fs::remove(e.path(), ec);
    }
    fs::remove(dir / (tag + ".safetensors"), ec);
    fs::remove(dir / (tag + ".state.safetensors"), ec);
  }
}

Checkpoint load_sharded(const fs::path& dir, const std::string& tag) {
  const auto mpath = manifest_path(dir, tag);
  const auto m = read_json(mpath, "checkpoint manifest");
  Checkpoint ck;
  try {
    ck.state.step = m.at("step").get<int64_t>();
    ck.state.epoch = m.at("epoch").get<int64_t>();
    ck.state.best_test_accuracy = m.at("best_test_accuracy").get<double>();
    ck.state.world_size = m.at("world_size").get<int64_t>();
    ck.state.config_json = m.at("config").get<std::string>();
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError("checkpoint manifest " + mpath.string() + " is incomplete: " + e.what(),
                          "the file is damaged; resume from another checkpoint");
  }
  if (m.value("version", 0) > kCheckpointVersion)
    throw CheckpointError(mpath.string() + " has checkpoint version " + std::to_string(m.value("version", 0)) +
                              "; this cohort reads up to " + std::to_string(kCheckpointVersion),
                          "resume with the newer cohort that wrote it");
  const auto cpath = commit_path(dir, tag);
  if (!fs::exists(cpath))
    throw CheckpointError("sharded checkpoint '" + tag + "' in " + dir.string() + " has no commit marker " +
                              cpath.filename().string() + ": its save did not finish",
                          "resume from another checkpoint (best), or from a copy made before the interrupted save");
  const auto commit = read_json(cpath, "commit marker");
  if (commit.value("step", int64_t{-1}) != ck.state.step)
    throw CheckpointError(cpath.string() + " is for step " + std::to_string(commit.value("step", int64_t{-1})) +
                              " but the manifest is for step " + std::to_string(ck.state.step),
                          "a save was interrupted; resume from another checkpoint");
  const int world = static_cast<int>(ck.state.world_size);
  std::vector<std::map<std::string, at::Tensor>> shards(world);
  for (int r = 0; r < world; ++r) {
    const auto path = dir / shard_file_name(tag, r, world);
    if (!fs::exists(path))
      throw CheckpointError("shard " + path.string() + " of checkpoint '" + tag + "' (rank " + std::to_string(r) + " of " +
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
      throw CheckpointError("shard " + path + " lacks tensor '" + name + "'", "the shard is damaged or from another model");
    if (it->second.numel() != numel)
      throw CheckpointError("shard " + path + ": tensor '" + name + "' has " + std::to_string(it->second.numel()) +
                                " elements, the manifest says " + std::to_string(numel),
                            "the shard is from another model or world size");
    return it->second.reshape(-1);
  };
  try {
    const auto kinds = m.at("kinds").get<std::vector<std::string>>();
    const auto& units = m.at("units");
    for (size_t u = 0; u < units.size(); ++u) {
      const auto& unit = units[u];
      const int64_t shard = unit.at("shard").get<int64_t>();
      auto assemble = [&](const std::string& prefix) {
        std::vector<at::Tensor> parts;
        for (int r = 0; r < world; ++r) parts.push_back(piece(r, prefix + ".u" + std::to_string(u), shard));
        return at::cat(parts);
      };
      std::vector<std::pair<std::string, at::Tensor>> flats{{"", assemble("param")}};
      for (const auto& kind : kinds) flats.emplace_back(kind + ".", assemble(kind));
      for (const auto& p : unit.at("params")) {
        const auto name = p.at("name").get<std::string>();
        const auto shape = p.at("shape").get<std::vector<int64_t>>();
        int64_t numel = 1;
        for (auto d : shape) numel *= d;
        const int64_t off = p.at("offset").get<int64_t>();
        if (off + numel > shard * world)
          throw CheckpointError(mpath.string() + ": parameter '" + name + "' lies outside its unit", "the manifest is damaged");
        for (const auto& [prefix, flat] : flats) {
          auto t = flat.narrow(0, off, numel).view(shape).clone();
          (prefix.empty() ? ck.model : ck.optimizer).emplace_back(prefix + name, t);
        }
      }
    }
    for (const auto& b : m.at("buffers")) {
      const auto name = b.get<std::string>();
      auto it = shards[0].find("buffer." + name);
      if (it == shards[0].end())
        throw CheckpointError("shard " + (dir / shard_file_name(tag, 0, world)).string() + " lacks buffer '" + name + "'",
                              "the shard is damaged");
      ck.model.emplace_back(name, it->second);
    }
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError("checkpoint manifest " + mpath.string() + " is malformed: " + e.what(),
                          "the file is damaged; resume from another checkpoint");
  }
  if (auto it = shards[0].find("step"); it != shards[0].end()) ck.optimizer.emplace_back("step", it->second);
  return ck;
}

Checkpoint load_any(const fs::path& dir, const std::string& tag) {
  return has_sharded(dir, tag) ? load_sharded(dir, tag) : load(dir, tag);
}

}  // namespace cohort::checkpoint

#include "cohort/checkpoint/Steps.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cohort/checkpoint/Names.h"
#include "cohort/checkpoint/ShardedCheckpoint.h"
#include "cohort/util/AtomicFile.h"
#include "cohort/util/Error.h"

namespace cohort::checkpoint {
namespace fs = std::filesystem;
namespace {

std::optional<StepDir> parse_name(const fs::path& p) {
  const std::string name = p.filename().string();
  if (name.rfind(names::kStepDirPrefix, 0) != 0) return std::nullopt;
  const std::string rest = name.substr(names::kStepDirPrefix.size());
  const auto dot = rest.find('.');
  const std::string digits = rest.substr(0, dot);
  const std::string serial = dot == std::string::npos ? "0" : rest.substr(dot + 1);
  auto all_digits = [](const std::string& s) {
    return !s.empty() && s.size() <= 18 && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  if (!all_digits(digits) || !all_digits(serial)) return std::nullopt;
  return StepDir{p, std::stoll(digits), std::stoll(serial)};
}

std::string dir_name(int64_t step, int64_t serial) {
  char buf[48];
  if (serial == 0)
    std::snprintf(buf, sizeof buf, "%s%08lld", names::kStepDirPrefix.c_str(), static_cast<long long>(step));
  else
    std::snprintf(buf, sizeof buf, "%s%08lld.%lld", names::kStepDirPrefix.c_str(), static_cast<long long>(step),
                  static_cast<long long>(serial));
  return buf;
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The links in ck_dir that point into step directories: the ones to refresh or drop.
bool is_step_link(const fs::path& p) {
  std::error_code ec;
  if (!fs::is_symlink(fs::symlink_status(p, ec))) return false;
  return fs::read_symlink(p, ec).string().rfind(names::kStepDirPrefix, 0) == 0;
}

void link_atomically(const fs::path& link, const fs::path& target) {
  const fs::path tmp = link.parent_path() / (link.filename().string() + ".link-tmp");
  std::error_code ec;
  fs::remove(tmp, ec);
  fs::create_symlink(target, tmp, ec);
  if (!ec) fs::rename(tmp, link, ec);
  if (ec) std::cerr << "cohort: note: cannot update the link " << link.string() << ": " << ec.message() << std::endl;
}

}  // namespace

std::vector<StepDir> list_step_dirs(const fs::path& ck_dir) {
  std::vector<StepDir> out;
  std::error_code ec;
  if (!fs::is_directory(ck_dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(ck_dir, ec)) {
    if (!e.is_directory(ec) || e.is_symlink(ec)) continue;
    if (auto s = parse_name(e.path())) out.push_back(*s);
  }
  std::sort(out.begin(), out.end(), [](const StepDir& a, const StepDir& b) {
    return a.step != b.step ? a.step > b.step : a.serial > b.serial;
  });
  return out;
}

fs::path new_step_dir(const fs::path& ck_dir, int64_t step) {
  for (int64_t serial = 0;; ++serial) {
    const fs::path p = ck_dir / dir_name(step, serial);
    std::error_code ec;
    if (!fs::exists(p, ec)) return p;
  }
}

CommitMarker parse_commit_marker(std::string_view text, const std::string& source) {
  auto bad = [&](const std::string& why) -> CheckpointError {
    return CheckpointError("commit marker " + source + " is damaged: " + why,
                           "the save it marks is passed over; an older step directory is used");
  };
  const auto j = nlohmann::json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) throw bad("not a JSON object");
  CommitMarker m;
  const auto step = j.find("step");
  if (step == j.end() || !step->is_number_integer() || step->get<int64_t>() < 0)
    throw bad("'step' is not a non-negative integer");
  m.step = step->get<int64_t>();
  const auto files = j.find("files");
  if (files == j.end() || !files->is_array()) throw bad("'files' is not a list");
  for (const auto& f : *files) {
    if (!f.is_object()) throw bad("an entry of 'files' is not an object");
    const auto name = f.find("name");
    const auto bytes = f.find("bytes");
    if (name == f.end() || !name->is_string()) throw bad("a file entry has no 'name' string");
    if (bytes == f.end() || !bytes->is_number_unsigned()) throw bad("a file entry has no 'bytes' count");
    const auto n = name->get<std::string>();
    if (n.empty() || n.find('/') != std::string::npos || n.find('\0') != std::string::npos || n == "." || n == "..")
      throw bad("file name '" + n + "' is not a plain file name");
    m.files.emplace_back(n, bytes->get<uint64_t>());
  }
  return m;
}

std::string step_dir_problem(const fs::path& step_dir) {
  const fs::path marker = step_dir / names::kStepCommit;
  std::error_code ec;
  if (!fs::exists(marker, ec)) return "no COMMIT marker (the save was cut off before it finished)";
  try {
    for (const auto& [name, bytes] : parse_commit_marker(read_text(marker), marker.string()).files) {
      const fs::path p = step_dir / name;
      if (!fs::exists(p, ec)) return "file " + name + " listed in COMMIT is missing";
      const auto size = fs::file_size(p, ec);
      if (ec || size != bytes)
        return "file " + name + " has " + std::to_string(size) + " bytes, COMMIT says " + std::to_string(bytes);
    }
  } catch (const Error& e) {
    return e.what();
  }
  return {};
}

void commit_step(const fs::path& ck_dir, const fs::path& step_dir, int64_t step, int keep_last) {
  nlohmann::json files = nlohmann::json::array();
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(step_dir)) {
    const auto name = e.path().filename().string();
    if (name == names::kStepCommit || name.find(".tmp.") != std::string::npos) continue;
    names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  for (const auto& name : names) files.push_back({{"name", name}, {"bytes", fs::file_size(step_dir / name)}});
  util::write_file_atomic(step_dir / names::kStepCommit,
                          nlohmann::json{{"step", step}, {"files", files}}.dump(1) + "\n");

  // Links: ck_dir/<name> -> step-N/<name> for this save's files. Links into older saves go, and so do
  // flat files of the same tag from an older cohort (or a copy that followed the links): a committed step
  // directory supersedes them, and a stale shard beside the links would mislead people and tools.
  std::error_code ec;
  const std::string tag_prefix = names.empty() ? std::string() : names.front().substr(0, names.front().find('.') + 1);
  for (const auto& e : fs::directory_iterator(ck_dir, ec)) {
    const auto name = e.path().filename().string();
    const bool ours =
        is_step_link(e.path()) || (!tag_prefix.empty() && name.rfind(tag_prefix, 0) == 0 && !e.is_directory(ec));
    if (ours && std::find(names.begin(), names.end(), name) == names.end()) fs::remove(e.path(), ec);
  }
  for (const auto& name : names) {
    const fs::path link = ck_dir / name;
    // A regular file of that name is from an older cohort's flat layout: replace it by the link.
    link_atomically(link, step_dir.filename() / name);
  }
  // Retention: keep the newest keep_last committed saves (this one included).
  int kept = 0;
  bool newer_than_this = true;
  for (const auto& d : list_step_dirs(ck_dir)) {
    if (d.path == step_dir) newer_than_this = false;
    if (newer_than_this) continue;  // a directory a concurrent or later save owns: not ours to judge
    const bool committed = step_dir_problem(d.path).empty();
    if (committed && kept < keep_last) {
      ++kept;
      continue;
    }
    fs::remove_all(d.path, ec);
  }
}

bool has_resumable(const fs::path& ck_dir) {
  for (const auto& d : list_step_dirs(ck_dir))
    if (fs::exists(d.path / names::kStepCommit)) return true;
  std::error_code ec;
  return fs::exists(ck_dir / names::weights_file(names::kLast), ec) ||
         fs::exists(ck_dir / names::commit_file(names::kLast), ec);
}

Latest load_latest(const fs::path& ck_dir) {
  Latest out;
  for (const auto& d : list_step_dirs(ck_dir)) {
    const std::string name = d.path.filename().string();
    std::string problem = step_dir_problem(d.path);
    if (problem.empty()) {
      try {
        out.checkpoint = load_any(d.path, names::kLast);
        out.dir = d.path;
        return out;
      } catch (const Error& e) {
        problem = e.what();
      }
    }
    out.skipped.push_back(name + ": " + problem);
  }
  // Runs saved before step directories keep last.* directly in ck_dir (regular files, not our links).
  std::error_code ec;
  const auto weights = ck_dir / names::weights_file(names::kLast),
             manifest = ck_dir / names::manifest_file(names::kLast);
  const bool flat =
      (fs::exists(weights, ec) && !is_step_link(weights)) || (fs::exists(manifest, ec) && !is_step_link(manifest));
  if (flat) {
    try {
      out.checkpoint = load_any(ck_dir, names::kLast);
      out.dir = ck_dir;
      return out;
    } catch (const Error& e) {
      out.skipped.push_back(ck_dir.string() + "/last.*: " + e.what());
    }
  }
  std::string all;
  for (const auto& s : out.skipped) all += "\n  " + s;
  throw CheckpointError("no complete checkpoint to resume from in " + ck_dir.string() +
                            (all.empty() ? std::string(" (it holds none)") : ":" + all),
                        "start without train.resume, or point it at a run whose checkpoints/ holds a step-* "
                        "directory with a COMMIT marker");
}

ModelWeights load_model_weights(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(path)) return {load_safetensors(path).tensors, path.string()};
  const auto dir = resolve_resume_dir(path);
  if (fs::exists(dir / names::weights_file(names::kBest)) || fs::exists(dir / names::manifest_file(names::kBest)))
    return {load_any(dir, names::kBest).model, (dir / names::kBest).string()};
  auto latest = load_latest(dir);
  return {std::move(latest.checkpoint.model), latest.dir.string()};
}

}  // namespace cohort::checkpoint

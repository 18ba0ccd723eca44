// Parses values, TOML files and overrides against the table of keys (config/Fields.h, config/Fields.cpp).
// What combinations are refused is Validate.cpp's.
#include "cohort/config/Config.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <fstream>
#include <functional>
#include <sstream>

#include <toml++/toml.h>
#include <nlohmann/json.hpp>

#include "cohort/config/Fields.h"
#include "cohort/config/TomlGuard.h"
#include "cohort/util/Error.h"

namespace cohort::config {
namespace {

using namespace detail;

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

// Keys an earlier cohort read, with what to write instead: a user's old config gets that, not "unknown
// key"; a run directory's saved config.json (which cohort wrote, not the user) is migrated by from_json.
struct RemovedKey {
  const char* key;
  const char* instead;
  void (*migrate)(TrainConfig& cfg, const std::string& value);
};
const RemovedKey kRemovedKeys[] = {
    {"dist.grad_dtype",
     "write dist.compress=fp16 or dist.compress=bf16 instead (the same gradient hook); for dist.grad_dtype=fp32 "
     "remove the line (dist.compress=none is the default)",
     [](TrainConfig& cfg, const std::string& value) {
       if (value != "fp32") cfg.dist.compress = value;
     }},
};

const Field& find_field(const std::string& key) {
  for (const auto& removed : kRemovedKeys)
    if (key == removed.key) throw ConfigError("config key '" + key + "' was removed in cohort 0.2", removed.instead);
  const auto& all = fields();
  auto it = std::find_if(all.begin(), all.end(), [&](const Field& f) { return f.info.key == key; });
  if (it != all.end()) return *it;
  const Field* best = &all.front();
  for (const auto& f : all)
    if (edit_distance(f.info.key, key) < edit_distance(best->info.key, key)) best = &f;
  throw ConfigError("unknown config key '" + key + "'",
                    "did you mean '" + best->info.key + "'? `cohort train --help` lists every key");
}

// Flattens a TOML table into dotted keys with values as their command-line text.
void flatten(const toml::table& table, const std::string& prefix, std::vector<std::pair<std::string, std::string>>& out,
             const std::string& file) {
  for (const auto& [k, node] : table) {
    const std::string key = prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
    if (const auto* sub = node.as_table()) {
      flatten(*sub, key, out, file);
    } else if (const auto* s = node.as_string()) {
      out.emplace_back(key, s->get());
    } else if (const auto* i = node.as_integer()) {
      out.emplace_back(key, std::to_string(i->get()));
    } else if (const auto* d = node.as_floating_point()) {
      std::ostringstream os;
      os.precision(17);
      os << d->get();
      out.emplace_back(key, os.str());
    } else if (const auto* b = node.as_boolean()) {
      out.emplace_back(key, b->get() ? "true" : "false");
    } else {
      throw ConfigError(file + ": config key '" + key + "' has a value of an unsupported type",
                        "use a string, number or boolean");
    }
  }
}

}  // namespace

std::vector<KeyInfo> keys() {
  std::vector<KeyInfo> out;
  for (const auto& f : fields()) out.push_back(f.info);
  return out;
}

void set(TrainConfig& cfg, const std::string& key, const std::string& value) { find_field(key).set(cfg, value); }

void apply_override(TrainConfig& cfg, const std::string& assignment) {
  const auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0)
    throw ConfigError("override '" + assignment + "' is not of the form key=value",
                      "write for example data.batch_size=64");
  set(cfg, trim(assignment.substr(0, eq)), trim(assignment.substr(eq + 1)));
}

TrainConfig load_from_string(std::string_view toml_text, const std::string& source,
                             const std::vector<std::string>& overrides, const TrainConfig& base) {
  TrainConfig cfg = base;
  refuse_what_toml_cannot_read(toml_text, source);  // See Note [toml++ 3.3 and non-ASCII text]
  toml::table table;
  try {
    table = toml::parse(toml_text, source);
  } catch (const toml::parse_error& e) {
    std::ostringstream os;
    os << source << ":" << e.source().begin.line << ":" << e.source().begin.column
       << ": not valid TOML: " << e.description();
    throw ConfigError(os.str(), "the config file is TOML: [section] headers and key = value lines");
  }
  std::vector<std::pair<std::string, std::string>> flat;
  flatten(table, "", flat, source);
  for (const auto& [k, v] : flat) {
    try {
      set(cfg, k, v);
    } catch (const ConfigError& e) {
      throw ConfigError(source + ": " + e.what(), e.hint());
    }
  }
  for (const auto& o : overrides) apply_override(cfg, o);
  validate(cfg);
  return cfg;
}

TrainConfig load(const std::optional<std::filesystem::path>& file, const std::vector<std::string>& overrides,
                 const TrainConfig& base) {
  if (!file) {
    TrainConfig cfg = base;
    for (const auto& o : overrides) apply_override(cfg, o);
    validate(cfg);
    return cfg;
  }
  if (!std::filesystem::exists(*file))
    throw ConfigError("config file '" + file->string() + "' does not exist", "check the --config path");
  std::ifstream in(*file, std::ios::binary);
  std::ostringstream text;
  if (in) text << in.rdbuf();
  if (!in || in.bad())
    throw ConfigError("config file '" + file->string() + "' cannot be read",
                      "check the --config path and its permissions");
  return load_from_string(text.str(), file->string(), overrides, base);
}

nlohmann::json to_json(const TrainConfig& cfg) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& f : fields()) j[f.info.key] = f.get(cfg);
  return j;
}

const std::vector<std::string>& machine_local_keys() {
  // Where things live and how many threads a machine has: a job may set them per machine. And the name
  // of a swarm peer's MLflow run: each peer is a run of its own, which its user may name.
  static const std::vector<std::string> keys = {
      "run.dir",       "train.resume",    "data.root",          "train.threads", "data.workers",
      "data.prefetch", "log.progress",    "log.monitor_s",      "swarm.listen",  "swarm.initial_peers",
      "swarm.token",   "swarm.partition", "log.mlflow_run_name"};
  return keys;
}

std::vector<std::string> differing_keys(const nlohmann::json& a, const nlohmann::json& b) {
  const auto& local = machine_local_keys();
  std::vector<std::string> out;
  auto consider = [&](const std::string& k) {
    if (std::find(local.begin(), local.end(), k) != local.end()) return;
    if (std::find(out.begin(), out.end(), k) != out.end()) return;
    if (!a.contains(k) || !b.contains(k) || a.at(k) != b.at(k)) out.push_back(k);
  };
  for (const auto& [k, v] : a.items()) consider(k);
  for (const auto& [k, v] : b.items()) consider(k);
  return out;
}

TrainConfig from_json(const nlohmann::json& j) {
  TrainConfig cfg;
  for (const auto& [k, v] : j.items()) {
    const std::string value = v.is_string() ? v.get<std::string>() : v.dump();
    auto removed = std::find_if(std::begin(kRemovedKeys), std::end(kRemovedKeys),
                                [&k = k](const RemovedKey& r) { return k == r.key; });
    if (removed != std::end(kRemovedKeys))
      removed->migrate(cfg, value);
    else
      set(cfg, k, value);
  }
  return cfg;
}

std::string help_text() {
  std::ostringstream os;
  os << "Config keys (set in a TOML file given by --config, or as key=value on the command line):\n";
  std::string section;
  for (const auto& f : fields()) {
    const auto dot = f.info.key.find('.');
    if (f.info.key.substr(0, dot) != section) {
      section = f.info.key.substr(0, dot);
      os << "\n  [" << section << "]\n";
    }
    std::string def = f.info.default_value.empty() ? "\"\"" : f.info.default_value;
    os << "  " << f.info.key << " (" << f.info.type << ", default " << def << ")\n      " << f.info.help;
    if (!f.info.choices.empty()) {
      os << "; one of:";
      for (const auto& c : f.info.choices) os << " " << c;
    }
    os << "\n";
  }
  return os.str();
}

}  // namespace cohort::config

namespace cohort {

StrategyKind strategy_kind(const std::string& name) {
  static const std::pair<const char*, StrategyKind> kinds[] = {
      {"ddp", StrategyKind::kDdp},   {"zero1", StrategyKind::kZero1}, {"zero2", StrategyKind::kZero2},
      {"fsdp", StrategyKind::kFsdp}, {"swarm", StrategyKind::kSwarm}, {"diloco", StrategyKind::kDiloco}};
  for (const auto& [n, k] : kinds)
    if (name == n) return k;
  throw ConfigError("dist.strategy=" + name + " is not a strategy", "use ddp, zero1, zero2, fsdp, swarm or diloco");
}

}  // namespace cohort

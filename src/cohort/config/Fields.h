// The table of config keys, each with its type, default, help, choices and check, and the helpers that
// build a row: config/Config.cpp parses and prints against it, config/Fields.cpp holds the rows. Internal
// to config/; a program reads keys through config::keys() (Config.h).
//
//   const auto& f = cohort::config::detail::fields();   // every key, in --help's order
//   f.front().set(cfg, "resnet18");                       // parses, checks and assigns one value
#pragma once

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cohort/config/Config.h"
#include "cohort/util/Error.h"

namespace cohort::config::detail {

// A constraint on a value: returns an empty string when fine, otherwise what is wrong.
template <class V>
using Check = std::function<std::string(const V&)>;

template <class V>
Check<V> positive() {
  return [](const V& v) { return v > 0 ? std::string() : std::string("must be > 0"); };
}
template <class V>
Check<V> non_negative() {
  return [](const V& v) { return v >= 0 ? std::string() : std::string("must be >= 0"); };
}
inline Check<double> in_range(double lo, double hi) {
  return [lo, hi](const double& v) {
    return (v >= lo && v <= hi) ? std::string() : "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  };
}

struct Field {
  KeyInfo info;
  std::function<void(TrainConfig&, const std::string&)> set;
  std::function<nlohmann::json(const TrainConfig&)> get;
  std::function<void(const TrainConfig&)> check;
};

[[noreturn]] inline void bad_value(const std::string& key, const std::string& value, const std::string& why,
                                   const std::string& hint) {
  throw ConfigError("config key '" + key + "': bad value '" + value + "': " + why, hint);
}

inline std::string trim(std::string s) {
  auto not_space = [](unsigned char c) { return !std::isspace(c); };
  s.erase(s.begin(), std::find_if(s.begin(), s.end(), not_space));
  s.erase(std::find_if(s.rbegin(), s.rend(), not_space).base(), s.end());
  return s;
}

template <class V>
V parse_value(const std::string& key, const std::string& text);

template <>
inline int64_t parse_value<int64_t>(const std::string& key, const std::string& text) {
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno == ERANGE) bad_value(key, text, "expected an integer", key + "=128");
  return v;
}
template <>
inline uint64_t parse_value<uint64_t>(const std::string& key, const std::string& text) {
  errno = 0;
  char* end = nullptr;
  if (!text.empty() && text[0] == '-') bad_value(key, text, "expected a non-negative integer", key + "=0");
  const unsigned long long v = std::strtoull(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno == ERANGE)
    bad_value(key, text, "expected a non-negative integer", key + "=0");
  return v;
}
template <>
inline double parse_value<double>(const std::string& key, const std::string& text) {
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || errno == ERANGE || !std::isfinite(v))
    bad_value(key, text, "expected a finite number", key + "=0.1");
  return v;
}
template <>
inline bool parse_value<bool>(const std::string& key, const std::string& text) {
  std::string t = text;
  std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return std::tolower(c); });
  if (t == "true" || t == "1" || t == "yes" || t == "on") return true;
  if (t == "false" || t == "0" || t == "no" || t == "off") return false;
  bad_value(key, text, "expected true or false", key + "=true");
}
template <>
inline std::string parse_value<std::string>(const std::string&, const std::string& text) {
  return text;
}

template <class V>
std::string type_name() {
  if constexpr (std::is_same_v<V, bool>)
    return "bool";
  else if constexpr (std::is_integral_v<V>)
    return "int";
  else if constexpr (std::is_floating_point_v<V>)
    return "float";
  else
    return "string";
}

template <class V>
std::string to_text(const V& v) {
  if constexpr (std::is_same_v<V, bool>)
    return v ? "true" : "false";
  else if constexpr (std::is_same_v<V, std::string>)
    return v;
  else {
    std::ostringstream os;
    os << v;
    return os.str();
  }
}

template <class S, class V>
Field field(std::string key, S TrainConfig::*section, V S::*member, std::string help,
            std::vector<std::string> choices = {}, Check<V> check = {}) {
  Field f;
  const TrainConfig defaults;
  f.info = KeyInfo{key, type_name<V>(), to_text((defaults.*section).*member), std::move(help), choices};
  f.set = [key, section, member, choices, check](TrainConfig& cfg, const std::string& text) {
    V v = parse_value<V>(key, text);
    if constexpr (std::is_same_v<V, std::string>) {
      if (!choices.empty() && std::find(choices.begin(), choices.end(), v) == choices.end()) {
        std::string all;
        for (const auto& c : choices) all += (all.empty() ? "" : ", ") + c;
        bad_value(key, text, "must be one of: " + all, key + "=" + choices.front());
      }
    }
    if (check) {
      if (auto why = check(v); !why.empty()) bad_value(key, text, why, "see `cohort train --help`");
    }
    (cfg.*section).*member = std::move(v);
  };
  f.get = [section, member](const TrainConfig& cfg) { return nlohmann::json((cfg.*section).*member); };
  return f;
}

// A switch that may also be left to cohort: "auto", or any spelling of a bool, stored as auto|true|false.
template <class Section>
Field auto_bool_field(std::string key, Section TrainConfig::*section, std::string Section::*member, std::string help) {
  Field f;
  f.info = KeyInfo{key, "string", TrainConfig{}.*section.*member, std::move(help), {"auto", "true", "false"}};
  f.set = [key, section, member](TrainConfig& cfg, const std::string& text) {
    std::string v = text;
    std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return std::tolower(c); });
    if (v != "auto") {
      try {
        v = parse_value<bool>(key, text) ? "true" : "false";
      } catch (const ConfigError&) {
        bad_value(key, text, "expected auto, true or false", key + "=auto");
      }
    }
    cfg.*section.*member = v;
  };
  f.get = [section, member](const TrainConfig& cfg) { return nlohmann::json(cfg.*section.*member); };
  return f;
}

// Every key, in the order --help and docs/cli.md list them.
const std::vector<Field>& fields();

}  // namespace cohort::config::detail

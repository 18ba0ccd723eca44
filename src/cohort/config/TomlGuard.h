// A guard in front of Debian's toml++ 3.3: refuses, with line and column, the config text that would make
// the library reach undefined behaviour (see Note [toml++ 3.3 and non-ASCII text]).
//
//   cohort::config::refuse_what_toml_cannot_read(text, "run.toml");   // throws ConfigError, or returns
//   auto table = toml::parse(text, "run.toml");
#pragma once

#include <string>
#include <string_view>

namespace cohort::config {

void refuse_what_toml_cannot_read(std::string_view text, const std::string& source);

}  // namespace cohort::config

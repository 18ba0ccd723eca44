// libFuzzer harness: the TOML config file (`cohort train --config`), parsed by toml++ and then checked
// key by key and across keys. load_from_string must reject bad input with cohort::ConfigError.
#include <cstddef>
#include <cstdint>

#include "FuzzSupport.h"
#include "cohort/config/Config.h"
#include "cohort/util/Error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto text = cohort::fuzz::as_text(data, size);
  try {
    cohort::config::load_from_string(text, "fuzz.toml");
  } catch (const cohort::ConfigError& e) {
    cohort::fuzz::rejected(e);
  }
  return 0;
}

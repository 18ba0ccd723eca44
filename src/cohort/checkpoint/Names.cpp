#include "cohort/checkpoint/Names.h"

#include <cstdio>

namespace cohort::checkpoint::names {

std::string weights_file(const std::string& tag) { return tag + ".safetensors"; }
std::string state_file(const std::string& tag) { return tag + ".state.safetensors"; }
std::string manifest_file(const std::string& tag) { return tag + ".manifest.json"; }
std::string commit_file(const std::string& tag) { return tag + ".commit"; }
std::string shard_file_prefix(const std::string& tag) { return tag + ".shard-"; }
std::string export_file(const std::string& tag) { return tag + ".full.safetensors"; }

std::string shard_file(const std::string& tag, int rank, int world) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%05d-of-%05d.safetensors", rank, world);
  return shard_file_prefix(tag) + buf;
}

std::string shard_param(size_t unit) { return shard_state(kShardParamKind, unit); }
std::string shard_state(const std::string& kind, size_t unit) { return kind + ".u" + std::to_string(unit); }

}  // namespace cohort::checkpoint::names

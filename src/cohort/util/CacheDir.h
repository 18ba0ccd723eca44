// Where cohort keeps what it can make again but would rather not, per user and machine: the measured CPU
// peaks (log/Peak.h) and the inflated copies of gzipped IDX files (data/Idx.h). $COHORT_CACHE when set,
// else ~/.cache/cohort (XDG's cache home under its default name), else /tmp/.cache/cohort without a home.
//
//   const auto peaks = cohort::util::cache_dir() / "peaks.json";
//
// Nothing in it is needed: a file missing or unreadable there is made again.
#pragma once

#include <filesystem>

namespace cohort::util {

std::filesystem::path cache_dir();

}  // namespace cohort::util

// How many files this process may open, raised to what the system allows. A Gloo rank holds a socket for
// each other rank, and rank 0's store a connection for each rank, so a job of a thousand ranks needs
// more than the usual soft limit of 1,024 descriptors (Note [Descriptors for a thousand ranks] in
// store/StoreServer.cpp).
//
//   const uint64_t limit = cohort::util::raise_open_file_limit();
//   if (auto why = cohort::util::open_file_shortfall(rank, world_size, rank == 0, limit)) throw CommError(*why, ...);
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace cohort::util {

// Raises this process's soft RLIMIT_NOFILE to its hard one (Go's runtime does the same at start) and
// returns the soft limit it then has; "unlimited" comes back as 2^20.
uint64_t raise_open_file_limit();

// The files a rank of `world_size` needs for its collectives and, when it hosts it, the store; empty when
// `limit` allows them, else what is short, in a sentence naming both numbers.
std::optional<std::string> open_file_shortfall(int rank, int world_size, bool hosts_store, uint64_t limit);

}  // namespace cohort::util

// The last collectives of this rank, kept for the post-mortem of a job that hung: op, dtype, element
// count, purpose ("gradient bucket 3"), when it was issued and ended, and what the rank was doing. PyTorch's
// Flight Recorder does the same for NCCL. Each rank writes its ring to RUN_DIR/flight/rank<R>.json when a
// collective fails or times out, when it aborts or faults (SIGABRT, SIGSEGV, ...), and on SIGUSR2 (the
// launcher sends it to the survivors before it stops them); `cohort doctor RUN_DIR` reads every rank's file side by
// side (comm/Doctor.h).
//
//   auto rec = std::make_shared<cohort::comm::FlightRecorder>(2000);
//   rec->issued(seq, "all_reduce", "gradient bucket 3", tensor);   // as the collective is launched
//   rec->ended(seq, true);                                         // when its wait() returns
//   cohort::comm::FlightDumps dumps(rec, run_dir, rank, world);    // SIGUSR2, a crash, an exception
//
// Recording costs a lock and a few stores into a preallocated slot: no allocation once the ring is full
// of slots that have held a purpose string as long (see Note [What one record costs] in the .cpp).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

namespace cohort::comm {

// What this process is doing now ("forward", "checkpoint", ...): the training loop's PhaseClock sets it,
// and every record and dump carries it. `phase` must be a string literal (it is kept as a pointer).
void set_current_phase(const char* phase);
const char* current_phase();

// The dump's format: one JSON object, {"format": kFlightFormat, "version": kFlightVersion, ...}.
inline constexpr const char* kFlightFormat = "cohort-flight-record";
// Version 2 added a swarm peer's "peer" and "rounds"; doctor reads 1 and 2.
inline constexpr int kFlightVersion = 2;

// Asks FlightDumps' thread to write this rank's record, with `reason` (a string literal) as its reason:
// what a signal does, from code (a swarm round that a peer left silent).
void request_flight_dump(const char* reason);

class FlightRecorder {
 public:
  explicit FlightRecorder(size_t capacity = 2000);

  // Keeps the last `capacity` collectives from now on (0: records nothing); forgets what it held.
  void resize(size_t capacity);
  void issued(uint64_t seq, const char* op, const std::string& what, const at::Tensor& t);
  void ended(uint64_t seq, bool ok);

  // A swarm peer's averaging rounds (Note [A swarm peer's rounds in its record] in FlightRecorder.cpp),
  // kept apart from the collectives, whose sequence numbers are this process's communicator's: the
  // peer's name, then each round as it begins (`kind`: "average", DiLoCo's "outer", or "weights") and ends, with
  // its group and the members that were silent in it.
  void set_peer(const std::string& name);
  void round_began(int64_t step, const char* kind);
  void round_ended(int64_t step, const std::vector<std::string>& group, const std::vector<std::string>& silent,
                   const std::string& problem);

  // The ring, oldest first, with this rank's identity and why it was written.
  nlohmann::json to_json(int rank, int world_size, const std::string& reason) const;
  // RUN_DIR/flight/rank<R>.json, written atomically; returns its path. Never throws (a dump that cannot be
  // written must not replace the error being reported): an empty path says it failed.
  std::filesystem::path write(const std::filesystem::path& run_dir, int rank, int world_size,
                              const std::string& reason) const noexcept;

 private:
  enum class State : uint8_t { kIssued, kCompleted, kFailed };
  struct Entry {
    uint64_t seq = 0;
    const char* op = "";
    std::string what;
    at::ScalarType dtype = at::ScalarType::Undefined;
    int64_t numel = 0;
    double issued_unix = 0, ended_unix = 0;
    State state = State::kIssued;
    const char* phase = "";
  };
  Entry* find(uint64_t seq);
  struct Round {
    int64_t step = 0;
    const char* kind = "";
    std::vector<std::string> group, silent;
    std::string problem;
    double began_unix = 0, ended_unix = 0;
    bool ended = false;
  };
  static constexpr size_t kRounds = 200;

  mutable std::mutex mu_;
  std::vector<Entry> ring_;
  size_t next_ = 0;        // the slot the next record takes
  uint64_t recorded_ = 0;  // records ever taken, so that a dump says how many fell out of the ring
  std::string peer_;       // a swarm peer's name; empty in a job of ranks
  std::deque<Round> rounds_;
};

// Writes the recorder's dump for this rank on SIGUSR2 and on a crash signal (Note [A crashed rank writes
// its record]; from a thread of its own: a signal handler may not
// write files) and when destroyed by an exception's unwinding (a collective that failed or timed out,
// or any other error of the worker). Lives for the training loop's lifetime.
class FlightDumps {
 public:
  FlightDumps(std::shared_ptr<FlightRecorder> recorder, std::filesystem::path run_dir, int rank, int world_size);
  ~FlightDumps();
  FlightDumps(const FlightDumps&) = delete;
  FlightDumps& operator=(const FlightDumps&) = delete;

 private:
  void watch();
  std::shared_ptr<FlightRecorder> recorder_;
  std::filesystem::path run_dir_;
  int rank_, world_size_;
  int uncaught_at_start_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread watcher_;
};

}  // namespace cohort::comm

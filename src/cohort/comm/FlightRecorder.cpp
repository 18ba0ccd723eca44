#include "cohort/comm/FlightRecorder.h"

#include <cerrno>
#include <chrono>
#include <csignal>
#include <exception>
#include <string>

#include <pthread.h>
#include <time.h>

#include <c10/core/ScalarType.h>

#include "cohort/util/AtomicFile.h"

namespace cohort::comm {
namespace {

std::atomic<const char*> g_phase{"setup"};
// Set by the handler, read by FlightDumps' thread: a lock-free atomic, which a handler may touch.
std::atomic<int> g_dump_requested{0};
static_assert(std::atomic<int>::is_always_lock_free);
std::atomic<const char*> g_dump_reason{nullptr};  // request_flight_dump's; null: SIGUSR2's

void on_sigusr2(int) { g_dump_requested = 1; }

// Note [A crashed rank writes its record]
// A rank that aborts (a failed assertion, std::terminate, glibc's heap checks) or faults (SIGSEGV,
// SIGBUS, SIGFPE, SIGILL) ends without unwinding, so no destructor writes its record, and the others'
// records alone only say it went away. A handler may not write a file (it could hold the allocator's
// lock or the recorder's), so it asks FlightDumps' thread for the dump, waits for it at most
// kCrashWait_ms (a thread blocked on a lock the crashed one holds never answers), then puts back the
// handler it found (the default's core dump, a sanitizer's report) and raises the signal again. A crash
// in that thread itself does not wait for itself. The record's reason is the signal's name, which `cohort
// doctor` reports as a crash.
constexpr int kCrashSignals[] = {SIGABRT, SIGSEGV, SIGBUS, SIGFPE, SIGILL};
constexpr int kCrashWait_ms = 3000;
struct sigaction g_before[NSIG];
std::atomic<int> g_crash_signal{0};  // the signal being handled, for the thread's dump
std::atomic<int> g_crash_dumped{0};
std::atomic<bool> g_watching{false};
pthread_t g_watcher;

void wait_for_the_dump() {
  for (int waited = 0; waited < kCrashWait_ms && g_crash_dumped.load() == 0; waited += 10) {
    const timespec ten_ms{0, 10'000'000};
    nanosleep(&ten_ms, nullptr);
  }
}

void on_crash(int sig, siginfo_t* info, void*) {
  const int saved_errno = errno;
  // The first crash asks for the dump; a second thread crashing meanwhile waits for the same one.
  if (g_watching.load() && !pthread_equal(pthread_self(), g_watcher)) {
    if (g_crash_signal.exchange(sig) == 0) g_dump_requested = 1;
    wait_for_the_dump();
  }
  sigaction(sig, &g_before[sig], nullptr);
  errno = saved_errno;
  // A fault the hardware raised (si_code > 0) happens again when this returns, now with the handler
  // found before and the fault's own details (a sanitizer's report names the address). One sent by
  // abort() or kill is raised again: delivered once this handler returns.
  if (info == nullptr || info->si_code <= 0) raise(sig);
}

std::string reason_of(int sig) {
  if (sig == 0) {
    const char* asked = g_dump_reason.exchange(nullptr);
    return asked ? asked : "SIGUSR2";
  }
  switch (sig) {
    case SIGABRT: return "SIGABRT";
    case SIGSEGV: return "SIGSEGV";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGILL: return "SIGILL";
    default: return "signal " + std::to_string(sig);
  }
}

double unix_now() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

const char* state_name(int s) { return s == 0 ? "issued" : s == 1 ? "completed" : "failed"; }

}  // namespace

void request_flight_dump(const char* reason) {
  g_dump_reason = reason;
  g_dump_requested = 1;
}

void set_current_phase(const char* phase) { g_phase.store(phase, std::memory_order_relaxed); }
const char* current_phase() { return g_phase.load(std::memory_order_relaxed); }

// Note [What one record costs]
// A record is taken for every collective, from the thread that launches it (autograd's, for ddp's
// buckets), so it must cost next to nothing beside the collective: a mutex taken without contention, a
// clock read and a few stores into a slot of a ring allocated once. The purpose string is assigned into
// the slot's own std::string, which keeps its capacity, so after the first lap no record allocates.
FlightRecorder::FlightRecorder(size_t capacity) : ring_(capacity) {}

void FlightRecorder::resize(size_t capacity) {
  std::lock_guard lock(mu_);
  ring_.assign(capacity, Entry{});
  next_ = 0;
  recorded_ = 0;
}

void FlightRecorder::issued(uint64_t seq, const char* op, const std::string& what, const at::Tensor& t) {
  std::lock_guard lock(mu_);
  if (ring_.empty()) return;
  Entry& e = ring_[next_];
  next_ = (next_ + 1) % ring_.size();
  ++recorded_;
  e.seq = seq;
  e.op = op;
  e.what.assign(what);
  e.dtype = t.defined() ? t.scalar_type() : at::ScalarType::Undefined;
  e.numel = t.defined() ? t.numel() : 0;
  e.issued_unix = unix_now();
  e.ended_unix = 0;
  e.state = State::kIssued;
  e.phase = current_phase();
}

FlightRecorder::Entry* FlightRecorder::find(uint64_t seq) {
  // The newest slots first: a collective ends a few records after it was issued, if not at once.
  for (size_t k = 1; k <= ring_.size() && k <= recorded_; ++k) {
    Entry& e = ring_[(next_ + ring_.size() - k) % ring_.size()];
    if (e.seq == seq) return &e;
  }
  return nullptr;
}

void FlightRecorder::ended(uint64_t seq, bool ok) {
  std::lock_guard lock(mu_);
  if (Entry* e = find(seq); e && e->state == State::kIssued) {
    e->state = ok ? State::kCompleted : State::kFailed;
    e->ended_unix = unix_now();
  }
}

// Note [A swarm peer's rounds in its record]
// A swarm peer's averaging happens outside its communicator (which holds its own local workers, often
// one), so its collectives say nothing of the swarm. Its record also keeps its last kRounds rounds: the
// step, the group, and the members that sent nothing or returned nothing within the averaging timeout
// (RoundOutcome::silent). A round that left a member silent writes the record at once, as a timed-out
// collective does (a survivor's training then goes on, and would otherwise leave no record). `cohort
// doctor` reads the peers' run dirs together and names the peer the others found silent, from which
// step, and whether its own record is missing (stopped, frozen, killed) or ends there.
void FlightRecorder::set_peer(const std::string& name) {
  std::lock_guard lock(mu_);
  peer_ = name;
}

void FlightRecorder::round_began(int64_t step, const char* kind) {
  std::lock_guard lock(mu_);
  if (rounds_.size() == kRounds) rounds_.pop_front();
  Round r;
  r.step = step;
  r.kind = kind;
  r.began_unix = unix_now();
  rounds_.push_back(std::move(r));
}

void FlightRecorder::round_ended(int64_t step, const std::vector<std::string>& group,
                                 const std::vector<std::string>& silent, const std::string& problem) {
  std::lock_guard lock(mu_);
  if (rounds_.empty() || rounds_.back().step != step || rounds_.back().ended) return;
  Round& r = rounds_.back();
  r.group = group;
  r.silent = silent;
  r.problem = problem;
  r.ended_unix = unix_now();
  r.ended = true;
}

nlohmann::json FlightRecorder::to_json(int rank, int world_size, const std::string& reason) const {
  std::lock_guard lock(mu_);
  nlohmann::json entries = nlohmann::json::array();
  const size_t held = std::min<uint64_t>(recorded_, ring_.size());
  for (size_t k = held; k >= 1; --k) {
    const Entry& e = ring_[(next_ + ring_.size() - k) % ring_.size()];
    nlohmann::json j = {{"seq", e.seq},
                        {"op", e.op},
                        {"what", e.what},
                        {"dtype", e.dtype == at::ScalarType::Undefined ? "" : c10::toString(e.dtype)},
                        {"numel", e.numel},
                        {"issued_unix", e.issued_unix},
                        {"state", state_name(static_cast<int>(e.state))},
                        {"phase", e.phase}};
    if (e.state != State::kIssued) j["ended_unix"] = e.ended_unix;
    entries.push_back(std::move(j));
  }
  nlohmann::json out = {{"format", kFlightFormat},      {"version", kFlightVersion}, {"rank", rank},
                        {"world_size", world_size},     {"reason", reason},          {"written_unix", unix_now()},
                        {"phase", current_phase()},     {"capacity", ring_.size()},  {"recorded", recorded_},
                        {"entries", std::move(entries)}};
  if (!peer_.empty()) {
    nlohmann::json rounds = nlohmann::json::array();
    for (const auto& r : rounds_) {
      nlohmann::json j = {
          {"step", r.step},
          {"kind", r.kind},
          {"began_unix", r.began_unix},
          {"group", r.group},
          {"silent", r.silent},
          {"problem", r.problem},
          {"state", r.ended ? (r.silent.empty() && r.problem.empty() ? "completed" : "failed") : "issued"}};
      if (r.ended) j["ended_unix"] = r.ended_unix;
      rounds.push_back(std::move(j));
    }
    out["peer"] = peer_;
    out["rounds"] = std::move(rounds);
  }
  return out;
}

std::filesystem::path FlightRecorder::write(const std::filesystem::path& run_dir, int rank, int world_size,
                                            const std::string& reason) const noexcept try {
  const auto dir = run_dir / "flight";
  std::filesystem::create_directories(dir);
  const auto path = dir / ("rank" + std::to_string(rank) + ".json");
  util::write_file_atomic(path, to_json(rank, world_size, reason).dump(1) + "\n");
  return path;
} catch (const std::exception&) {
  return {};
}

FlightDumps::FlightDumps(std::shared_ptr<FlightRecorder> recorder, std::filesystem::path run_dir, int rank,
                         int world_size)
    : recorder_(std::move(recorder)),
      run_dir_(std::move(run_dir)),
      rank_(rank),
      world_size_(world_size),
      uncaught_at_start_(std::uncaught_exceptions()) {
  if (!recorder_) return;
  struct sigaction sa {};
  sa.sa_handler = on_sigusr2;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGUSR2, &sa, nullptr);
  watcher_ = std::thread([this] { watch(); });
  // The crash signals (Note [A crashed rank writes its record] above).
  g_watcher = watcher_.native_handle();
  g_crash_signal = 0;
  g_crash_dumped = 0;
  g_watching = true;
  struct sigaction crash {};
  crash.sa_sigaction = on_crash;
  crash.sa_flags = SA_SIGINFO | SA_ONSTACK;  // the alternate stack, where one is set (a sanitizer's)
  sigemptyset(&crash.sa_mask);
  for (const int sig : kCrashSignals) {
    struct sigaction found {};
    sigaction(sig, nullptr, &found);
    // A second FlightDumps (one per training loop) keeps the handler the first one found.
    if (!(found.sa_flags & SA_SIGINFO) || found.sa_sigaction != on_crash) g_before[sig] = found;
    sigaction(sig, &crash, nullptr);
  }
}

FlightDumps::~FlightDumps() {
  if (!recorder_) return;
  g_watching = false;
  for (const int sig : kCrashSignals) sigaction(sig, &g_before[sig], nullptr);
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  watcher_.join();
  // Unwinding: whatever ended the loop (a collective that timed out, a peer gone, any error) is what the
  // other ranks' dumps are read against.
  if (std::uncaught_exceptions() > uncaught_at_start_) recorder_->write(run_dir_, rank_, world_size_, "error");
}

// A signal handler may only set a flag; this thread looks at it ten times a second and writes the dump.
void FlightDumps::watch() {
  std::unique_lock lock(mu_);
  while (!cv_.wait_for(lock, std::chrono::milliseconds(100), [this] { return stopping_; })) {
    if (g_dump_requested.exchange(0) == 0) continue;
    lock.unlock();
    // Read once: a crash during a dump asked for otherwise asks again, and is written next.
    const int crash = g_crash_signal.load();
    recorder_->write(run_dir_, rank_, world_size_, reason_of(crash));
    if (crash != 0) g_crash_dumped = 1;
    lock.lock();
  }
}

}  // namespace cohort::comm

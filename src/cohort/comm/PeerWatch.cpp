#include "cohort/comm/PeerWatch.h"

#include <algorithm>
#include <future>
#include <memory>
#include <vector>

#include <ATen/ATen.h>

#include "cohort/comm/FlightRecorder.h"
#include "cohort/util/Error.h"

namespace cohort::comm {
namespace {

void put(const c10::intrusive_ptr<c10d::Store>& store, const std::string& key, uint64_t value) {
  const auto text = std::to_string(value);
  try {
    store->set(key, std::vector<uint8_t>(text.begin(), text.end()));
  } catch (const std::exception&) {
    // The store is gone (rank 0 died): the collective itself will fail and say so.
  }
}

// How many times `cohort doctor --ask` asked this job for its flight records (Note [Asking every rank
// for its record]).
const char* const kAskKey = "cohort/flight/asked";

uint64_t read(const c10::intrusive_ptr<c10d::Store>& store, const std::string& key) {
  if (!store->check({key})) return 0;
  const auto v = store->get(key);
  return std::stoull(std::string(v.begin(), v.end()));
}

const char* kind_name(int64_t k) {
  static const char* names[] = {"?", "all_reduce", "broadcast", "all_gather", "reduce_scatter", "barrier"};
  return k >= 1 && k <= 5 ? names[k] : "?";
}

std::string describe(const int64_t* row) {
  std::string s = kind_name(row[0]);
  if (row[0] != static_cast<int64_t>(CollectiveKind::kBarrier))
    s += " on " + std::to_string(row[2]) + " x " +
         (row[1] >= 0 ? std::string(c10::toString(static_cast<c10::ScalarType>(row[1]))) : "?");
  return s;
}

}  // namespace

// Note [Naming the ranks that did not arrive]
// A backend's timeout says only that the collective did not complete, not who is missing. A heartbeat
// thread per rank tells more: every second it bumps a counter in the store and publishes the sequence
// number of the last collective the rank issued. After a failed collective we watch for 2.5 s. A rank whose
// counter stands still has stopped answering altogether (SIGSTOP, a frozen machine). A rank that beats
// but whose last issued number is below this collective's never reached it (hung elsewhere, or calling
// something else); its number is current, since it beat at least twice while we watched. (A silent
// rank's number may be a second old, so it is not quoted.) The collectives themselves only bump an
// atomic counter: a store write per collective would put a round trip to rank 0 on every bucket's
// launch. The query runs on its own thread with a bound, because the store lives on rank 0, which may
// itself be the rank that stopped.
PeerWatch::PeerWatch(c10::intrusive_ptr<c10d::Store> store, int rank, int size)
    : store_(std::move(store)), rank_(rank), size_(size) {
  if (size_ > 1) heartbeat_ = std::thread(beat, beat_, store_, rank_);
}

// A heartbeat may be inside a store call when its rank shuts down. If rank 0, which hosts the store,
// has already exited, that call goes on reconnecting until the store's timeout (dist.timeout_s), and
// joining it would hold this rank's exit that long: a finished job that hangs. So the heartbeat gets a
// moment to notice the stop, and is otherwise left behind; it owns what it touches, and ends when its
// call gives up or the process exits.
PeerWatch::~PeerWatch() {
  if (!heartbeat_.joinable()) return;
  std::unique_lock<std::mutex> lock(beat_->mu);
  beat_->stopping = true;
  beat_->cv.notify_all();
  const bool ended = beat_->cv.wait_for(lock, std::chrono::seconds(2), [this] { return beat_->done; });
  lock.unlock();
  if (ended)
    heartbeat_.join();
  else
    heartbeat_.detach();
}

uint64_t PeerWatch::issue() { return ++beat_->seq; }

// Note [Asking every rank for its record]
// A hung job's ranks are asked for their flight records by one command on any machine, `cohort doctor
// --ask RUN_DIR`, rather than SIGUSR2 to each machine's launcher: it adds one to a counter in the job's
// store, and each rank's heartbeat reads that counter with the beat it sends anyway (one more store
// round trip a second per rank; at 1,024 ranks, 1,024 small requests a second more to rank 0's store).
// A rank that sees the counter grow asks its FlightDumps thread for a record, as SIGUSR2 would. The
// heartbeat runs beside the training loop, so a rank stuck in a collective, its data loader or a barrier
// answers within about a second; a stopped rank (SIGSTOP, a frozen machine) cannot, and the command names
// it. The counter starts where the rank finds it, so a request made before a rank joined (an earlier
// attempt's) is not answered again.
uint64_t ask_for_flight_records(c10d::Store& store) { return static_cast<uint64_t>(store.add(kAskKey, 1)); }

void PeerWatch::beat(std::shared_ptr<Beat> b, c10::intrusive_ptr<c10d::Store> store, int rank) {
  int64_t asked = -1;
  for (uint64_t n = 1;; ++n) {
    // Not under the lock: the store may be slow.
    put(store, "cohort/issued/" + std::to_string(rank), b->seq.load());
    put(store, "cohort/beat/" + std::to_string(rank), n);
    try {
      const int64_t now = store->add(kAskKey, 0);
      if (asked >= 0 && now > asked) request_flight_dump("asked through the store (cohort doctor --ask)");
      asked = now;
    } catch (const std::exception&) {
      // As put's: a store that is gone is the collective's to report.
    }
    std::unique_lock<std::mutex> lock(b->mu);
    if (b->cv.wait_for(lock, std::chrono::seconds(1), [&] { return b->stopping; })) {
      b->done = true;
      b->cv.notify_all();
      return;
    }
  }
}

std::string PeerWatch::diagnose(uint64_t seq) const noexcept try {
  auto result = std::make_shared<std::promise<std::string>>();
  auto answer = result->get_future();
  // Detached, with its own references: it may outlive this PeerWatch when the store hangs.
  std::thread([store = store_, size = size_, self = rank_, seq, result] {
    try {
      std::vector<uint64_t> before(size);
      for (int r = 0; r < size; ++r) before[r] = read(store, "cohort/beat/" + std::to_string(r));
      std::this_thread::sleep_for(std::chrono::milliseconds(2500));
      std::string silent, missing;
      for (int r = 0; r < size; ++r) {
        if (r == self) continue;
        if (read(store, "cohort/beat/" + std::to_string(r)) == before[r]) {
          silent += (silent.empty() ? "" : ",") + std::to_string(r);
          continue;
        }
        const uint64_t last = read(store, "cohort/issued/" + std::to_string(r));
        if (last < seq)
          missing += (missing.empty() ? "" : ",") + std::to_string(r) + " (last issued #" + std::to_string(last) + ")";
      }
      std::string out;
      if (!silent.empty()) out = "rank(s) " + silent + " stopped answering (no heartbeat for 2.5 s)";
      if (!missing.empty()) out += (out.empty() ? "" : "; ") + std::string("rank(s) ") + missing + " never issued it";
      if (out.empty())
        out = "every rank is alive and has issued collective #" + std::to_string(seq) +
              " or a later one: it stalled or broke in the network or the backend, or the ranks called different "
              "collectives at #" +
              std::to_string(seq) + " (cohort doctor RUN_DIR compares them)";
      result->set_value(out);
    } catch (const std::exception& e) {
      result->set_value(std::string("the store did not answer (") + e.what() + ")");
    }
  }).detach();
  if (answer.wait_for(std::chrono::seconds(5)) != std::future_status::ready)
    return "the store on rank 0 did not answer within 5 s: rank 0 itself may be the one that stopped";
  return answer.get();
} catch (const std::exception& e) {  // no thread to be had, say: the timeout's own message stands
  return std::string("could not ask the store which ranks are missing (") + e.what() + ")";
}

at::Tensor collective_signature(CollectiveKind kind, const at::Tensor& t) {
  const int64_t dtype = t.defined() ? static_cast<int64_t>(t.scalar_type()) : -1;
  const int64_t numel = t.defined() ? t.numel() : 0;
  return at::tensor({static_cast<int64_t>(kind), dtype, numel}, at::kLong);
}

void check_same_collective(const at::Tensor& all, int rank, uint64_t seq, const std::string& what) {
  const auto rows = all.contiguous();
  const int64_t* a = rows.data_ptr<int64_t>();
  std::string diff;
  for (int64_t r = 0; r < rows.size(0); ++r)
    if (!std::equal(a + 3 * r, a + 3 * r + 3, a + 3 * rank))
      diff += "; rank " + std::to_string(r) + " called " + describe(a + 3 * r);
  if (!diff.empty())
    throw CommError("collective #" + std::to_string(seq) + " differs across ranks: rank " + std::to_string(rank) +
                        " called " + describe(a + 3 * rank) + " ('" + what + "')" + diff,
                    "every rank must call the same collectives in the same order with the same shapes; "
                    "look for rank-dependent branches around this one");
}

}  // namespace cohort::comm

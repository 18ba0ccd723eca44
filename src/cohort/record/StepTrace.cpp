#include "cohort/record/StepTrace.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iostream>
#include <limits>

#include "cohort/comm/FlightRecorder.h"
#include "cohort/util/AtomicFile.h"
#include "cohort/util/Error.h"

namespace cohort::record {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The trace's threads (rows) within a rank's process. Complete events on one row must nest, and
// collectives overlap (ddp issues bucket 1 before bucket 0 ends), so they take as many rows as are in
// flight at once, from kCollectivesRow on.
constexpr int kStepsRow = 0, kPhasesRow = 1, kRoundsRow = 2, kCollectivesRow = 3;

// A row's thread id, unique across ranks: readers take "tid" for a system-wide thread id, and Perfetto put
// rank 1's rows on rank 0's threads of the same tid, where their events overlapped and were dropped.
int64_t thread_id(int rank, int row) { return static_cast<int64_t>(rank) * 1000 + row; }

// Note [Trace times are small integers]
// Readers keep times in integer nanoseconds: Perfetto's trace processor multiplies "ts" (microseconds) by
// 1,000 in a double. A Unix time in microseconds (1.8e15) times 1,000 is past 2^53, where a double's step
// is 256 ns, so an event's end (ts + dur) can land past the next event's start on the same row, which a
// reader drops as a partial overlap (Perfetto's stat slice_drop_overlapping_complete_event). So times are
// whole microseconds from an origin, the whole second the window began in, which "otherData" gives; both
// ends of an event are rounded alike, and rounding keeps order, so events that nested or followed each
// other still do. The merge moves every rank to the earliest origin, in integers. Version 1 of this format
// lost 13 of a 2-rank trace's 36 complete events in Perfetto (Reference.StepTraceLoadsInPerfetto), to this
// and to thread ids that repeated across ranks (thread_id below).
json complete(const std::string& name, const char* category, double begin_us, double end_us, int64_t origin_us,
              int rank, int row) {
  const int64_t ts = std::llround(begin_us - static_cast<double>(origin_us));
  const int64_t end = std::llround(end_us - static_cast<double>(origin_us));
  return {{"name", name},
          {"cat", category},
          {"ph", "X"},
          {"ts", ts},
          {"dur", std::max<int64_t>(0, end - ts)},
          {"pid", rank},
          {"tid", thread_id(rank, row)}};
}

json label(const char* what, const std::string& name, int rank, int row) {
  return {{"name", what}, {"ph", "M"}, {"pid", rank}, {"tid", thread_id(rank, row)}, {"args", {{"name", name}}}};
}

// The flight record's collectives (and a swarm peer's rounds) that began inside [begin, end]; one still
// open at the end is drawn up to the end. Each collective takes the first row free when it begins.
void add_flight(const json& record, double begin_us, double end_us, int64_t origin_us, int rank, json& events) {
  std::vector<double> row_free_at;  // per collectives row, when its last event ends
  for (const auto& e : record["entries"]) {
    const double issued = e["issued_unix"].get<double>() * 1e6;
    if (issued < begin_us || issued > end_us) continue;
    const double ended = std::max(issued, e.contains("ended_unix") ? e["ended_unix"].get<double>() * 1e6 : end_us);
    size_t row = 0;
    while (row < row_free_at.size() && row_free_at[row] > issued) ++row;
    if (row == row_free_at.size()) {
      row_free_at.push_back(0);
      events.push_back(label("thread_name", row == 0 ? "collectives" : "collectives (" + std::to_string(row + 1) + ")",
                             rank, kCollectivesRow + static_cast<int>(row)));
    }
    row_free_at[row] = ended;
    auto ev = complete(e["op"].get<std::string>() + " '" + e["what"].get<std::string>() + "'", "collective", issued,
                       ended, origin_us, rank, kCollectivesRow + static_cast<int>(row));
    ev["args"] = {{"seq", e["seq"]}, {"dtype", e["dtype"]}, {"numel", e["numel"]}, {"state", e["state"]}};
    events.push_back(std::move(ev));
  }
  if (!record.contains("rounds")) return;
  events.push_back(label("thread_name", "swarm rounds", rank, kRoundsRow));
  for (const auto& r : record["rounds"]) {
    const double began = r["began_unix"].get<double>() * 1e6;
    if (began < begin_us || began > end_us) continue;
    const double ended = r.contains("ended_unix") ? r["ended_unix"].get<double>() * 1e6 : end_us;
    auto ev = complete("swarm " + r["kind"].get<std::string>() + " step " + std::to_string(r["step"].get<int64_t>()),
                       "swarm", began, ended, origin_us, rank, kRoundsRow);
    ev["args"] = {{"group", r["group"]}, {"silent", r["silent"]}, {"state", r["state"]}};
    events.push_back(std::move(ev));
  }
}

}  // namespace

StepTrace::StepTrace(std::pair<int64_t, int64_t> steps, fs::path run_dir, int rank,
                     std::shared_ptr<comm::FlightRecorder> flight)
    : first_(steps.first), last_(steps.second), run_dir_(std::move(run_dir)), rank_(rank), flight_(std::move(flight)) {}

void StepTrace::step_began(int64_t step) {
  if (step < first_ || step > last_ || done_) return;
  if (!recording_) {
    recording_ = true;
    window_begin_us_ = now_us();
    origin_us_ = static_cast<int64_t>(window_begin_us_ / 1e6) * 1000000;
    open_phase_ = {"other", window_begin_us_, 0};
  }
  if (traced_.empty() || traced_.back() != step) {
    steps_.push_back({"step " + std::to_string(step), now_us(), 0});
    traced_.push_back(step);
  }
}

void StepTrace::phase(const char* name) {
  if (!recording_) return;
  const double now = now_us();
  open_phase_.end_us = now;
  if (open_phase_.end_us > open_phase_.begin_us) phases_.push_back(open_phase_);
  open_phase_ = {name, now, 0};
}

void StepTrace::step_ended(int64_t step) {
  if (!recording_) return;
  if (steps_.back().end_us == 0) steps_.back().end_us = now_us();
  // A swarm peer that caught up may land past the window's last step: the window ends there too.
  if (step >= last_) close();
}

void StepTrace::finish() {
  if (!recording_) return;
  if (steps_.back().end_us == 0) {  // begun, never trained
    steps_.pop_back();
    traced_.pop_back();
  }
  close();
}

void StepTrace::close() {
  phase(open_phase_.name.c_str());
  recording_ = false;
  done_ = true;
  if (steps_.empty()) return;
  // What ran after the last traced step (a run's final evaluation and save) is not part of the window.
  const double end = steps_.back().end_us;
  phases_.erase(std::remove_if(phases_.begin(), phases_.end(), [&](const Span& p) { return p.begin_us >= end; }),
                phases_.end());
  for (auto& p : phases_) p.end_us = std::min(p.end_us, end);
  write(end);
}

// The Trace Event Format's JSON object form: "traceEvents" (complete events "X" with "ts" and "dur" in
// microseconds, and metadata "M" naming the process and its rows), "displayTimeUnit", and "otherData"
// for what the format leaves to the producer.
void StepTrace::write(double end) {
  json events = json::array();
  events.push_back(label("process_name", "rank " + std::to_string(rank_), rank_, kStepsRow));
  events.push_back({{"name", "process_sort_index"}, {"ph", "M"}, {"pid", rank_}, {"args", {{"sort_index", rank_}}}});
  events.push_back(label("thread_name", "steps", rank_, kStepsRow));
  events.push_back(label("thread_name", "phases", rank_, kPhasesRow));
  for (const auto& s : steps_)
    events.push_back(complete(s.name, "step", s.begin_us, s.end_us, origin_us_, rank_, kStepsRow));
  for (const auto& p : phases_)
    events.push_back(complete(p.name, "phase", p.begin_us, p.end_us, origin_us_, rank_, kPhasesRow));
  if (flight_) add_flight(flight_->to_json(rank_, 0, "trace"), window_begin_us_, end, origin_us_, rank_, events);
  const json trace = {{"traceEvents", std::move(events)},
                      {"displayTimeUnit", "ms"},
                      {"otherData",
                       {{"format", kStepTraceFormat},
                        {"version", kStepTraceVersion},
                        {"rank", rank_},
                        {"origin_unix_us", origin_us_},
                        {"steps", {traced_.front(), traced_.back()}},
                        {"collectives", flight_ ? "from the flight recorder (dist.flight_records)" : "none"}}}};
  // A trace is a diagnostic: one that cannot be written is said, and training goes on.
  try {
    fs::create_directories(run_dir_ / "trace");
    const auto path = run_dir_ / "trace" / ("rank" + std::to_string(rank_) + ".json");
    util::write_file_atomic(path, trace.dump() + "\n");
    written_ = path;
  } catch (const std::exception& e) {
    std::cerr << "cohort: WARNING: log.trace_steps: could not write " << (run_dir_ / "trace").string() << ": "
              << e.what() << " (is the disk full?); training goes on without the trace" << std::endl;
  }
}

namespace {

// A version 1 trace's times are absolute: its origin is 0, and the earliest whole second in it serves.
int64_t earliest_second(const json& trace) {
  const int64_t origin = trace["otherData"].value("origin_unix_us", int64_t{0});
  if (origin != 0) return origin;
  double first = std::numeric_limits<double>::max();
  for (const auto& e : trace["traceEvents"])
    if (e.contains("ts")) first = std::min(first, e["ts"].get<double>());
  return first == std::numeric_limits<double>::max() ? 0 : static_cast<int64_t>(first / 1e6) * 1000000;
}

}  // namespace

json merge_step_traces(const fs::path& run_dir) {
  const auto dir = run_dir / "trace";
  if (!fs::is_directory(dir)) return nullptr;
  std::vector<fs::path> files;
  for (const auto& f : fs::directory_iterator(dir))
    if (f.path().extension() == ".json") files.push_back(f.path());
  if (files.empty()) return nullptr;
  std::sort(files.begin(), files.end());
  std::vector<json> traces;
  json steps;
  for (const auto& f : files) {
    json t;
    try {
      t = json::parse(std::ifstream(f));
    } catch (const std::exception& e) {
      throw Error(f.string() + " is not JSON: " + e.what(), "remove it, or trace the steps again");
    }
    const auto other = t.value("otherData", json::object());
    const int version = other.value("version", 0);
    if (other.value("format", "") != kStepTraceFormat || version < 1 || version > kStepTraceVersion)
      throw Error(f.string() + " is not a step trace of version 1 to " + std::to_string(kStepTraceVersion),
                  "it was written by another program or another cohort; remove it");
    if (!steps.is_null() && other["steps"] != steps)
      throw Error(f.string() + " traced steps " + other["steps"].dump() + ", the files before it " + steps.dump(),
                  "the trace folder holds files of two runs: remove " + dir.string() + " and trace again");
    steps = other["steps"];
    traces.push_back(std::move(t));
  }
  int64_t origin = std::numeric_limits<int64_t>::max();
  for (const auto& t : traces) origin = std::min(origin, earliest_second(t));
  json events = json::array(), ranks = json::array();
  for (auto& t : traces) {
    const int64_t own = t["otherData"].value("origin_unix_us", int64_t{0});
    for (auto& e : t["traceEvents"]) {
      if (e.contains("ts"))
        e["ts"] = e["ts"].is_number_integer() ? e["ts"].get<int64_t>() + (own - origin)
                                              : std::llround(e["ts"].get<double>() + static_cast<double>(own - origin));
      if (e.contains("dur") && !e["dur"].is_number_integer()) e["dur"] = std::llround(e["dur"].get<double>());
      events.push_back(std::move(e));
    }
    ranks.push_back(t["otherData"]["rank"]);
  }
  return {{"traceEvents", std::move(events)},
          {"displayTimeUnit", "ms"},
          {"otherData",
           {{"format", kStepTraceFormat},
            {"version", kStepTraceVersion},
            {"origin_unix_us", origin},
            {"ranks", ranks},
            {"steps", steps}}}};
}

}  // namespace cohort::record

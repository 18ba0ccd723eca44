#include "cohort/comm/Doctor.h"

#include <algorithm>
#include <fstream>
#include <iomanip>
#include <iterator>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include "cohort/comm/FlightRecorder.h"
#include "cohort/util/Error.h"

namespace cohort::comm {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string describe(const json& e) {
  std::ostringstream os;
  os << "#" << e["seq"].get<uint64_t>() << " " << e["op"].get<std::string>() << " '" << e["what"].get<std::string>()
     << "'";
  if (!e["dtype"].get<std::string>().empty()) os << " (" << e["dtype"].get<std::string>() << " x " << e["numel"] << ")";
  return os.str();
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i)
    s += (i ? (i + 1 == ranks.size() ? " and " : ", ") : "") + std::to_string(ranks[i]);
  return (ranks.size() == 1 ? "rank " : "ranks ") + s;
}

json finding(const std::string& kind, std::vector<int> ranks, const std::string& text, int64_t seq = -1) {
  json f = {{"kind", kind}, {"ranks", ranks}, {"text", text}};
  if (seq >= 0) f["seq"] = seq;
  return f;
}

// Each rank's entries by sequence number.
using Ring = std::map<uint64_t, json>;

// Note [A record of a rank still running]
// A record asked of a running job (SIGUSR2, `cohort doctor --ask`) is a snapshot: the ranks write theirs
// up to a second apart and mid-step, so one may be a collective ahead of another, and each may be inside
// one that is about to end. A collective is a finding only once it has waited long enough to be one:
// kSettledS between its issue and the record of the rank that has not issued it, or in which it is still
// open. A hang has waited far longer (dist.timeout_s, 300 s by default) when it is asked about; the
// default job's step is 50 ms. A record written on an error or a crash is its rank's last word, and is
// taken as it stands.
constexpr double kSettledS = 2.0;

// How long after `issued_unix` rank `rank` wrote its record, if it was still running then; else forever.
double waited_when_written(const std::vector<json>& dumps, int rank, double issued_unix) {
  for (const auto& d : dumps) {
    if (d["rank"].get<int>() != rank) continue;
    const auto reason = d["reason"].get<std::string>();
    if (reason != "SIGUSR2" && reason.rfind("asked", 0) != 0) break;
    return d["written_unix"].get<double>() - issued_unix;
  }
  return std::numeric_limits<double>::infinity();
}

std::map<int, Ring> rings_of(const std::vector<json>& dumps) {
  std::map<int, Ring> rings;
  for (const auto& d : dumps) {
    auto& ring = rings[d["rank"].get<int>()];  // a rank that recorded nothing still has a (empty) ring
    for (const auto& e : d["entries"]) ring[e["seq"].get<uint64_t>()] = e;
  }
  return rings;
}

// Ranks of the job that wrote nothing: they were stopped, frozen or killed before they could.
void find_missing(const std::vector<json>& dumps, json& out) {
  std::set<int> have;
  int world = 0;
  for (const auto& d : dumps) {
    have.insert(d["rank"].get<int>());
    world = std::max(world, d["world_size"].get<int>());
  }
  std::vector<int> missing;
  for (int r = 0; r < world; ++r)
    if (!have.count(r)) missing.push_back(r);
  if (missing.empty()) return;
  out.push_back(finding("no_record", missing,
                        rank_list(missing) + " left no flight record: when the others stopped, " +
                            (missing.size() == 1 ? "it" : "they") +
                            " could not write one. A process stopped (SIGSTOP), frozen or killed (SIGKILL, the "
                            "out-of-memory killer) cannot; look there first"));
}

// Ranks whose record was written as they crashed (Note [A crashed rank writes its record] in
// FlightRecorder.cpp): what ended the job is in that rank's own output, not in the collectives.
void find_crashed(const std::vector<json>& dumps, json& out) {
  for (const auto& d : dumps) {
    const auto reason = d["reason"].get<std::string>();
    if (reason != "SIGABRT" && reason != "SIGSEGV" && reason != "SIGBUS" && reason != "SIGFPE" && reason != "SIGILL")
      continue;
    const auto& entries = d["entries"];
    const std::string after = entries.empty()                       ? "before its first collective"
                              : entries.back()["state"] == "issued" ? "in " + describe(entries.back())
                                                                    : "after " + describe(entries.back());
    out.push_back(finding("crashed", {d["rank"].get<int>()},
                          "rank " + std::to_string(d["rank"].get<int>()) + " crashed (" + reason + ") in phase '" +
                              d["phase"].get<std::string>() + "', " + after +
                              ": its own output (stderr, or the launcher's log) says why"));
  }
}

// The newest collective any rank issued, and the ranks that never issued it.
void find_never_issued(const std::vector<json>& dumps, const std::map<int, Ring>& rings, uint64_t desync, json& out) {
  uint64_t top = 0;
  for (const auto& [rank, ring] : rings)
    if (!ring.empty()) top = std::max(top, ring.rbegin()->first);
  if (top >= desync) return;
  std::vector<int> behind;
  for (const auto& d : dumps) {
    const auto& ring = rings.at(d["rank"].get<int>());
    if (ring.empty() || ring.rbegin()->first < top) behind.push_back(d["rank"].get<int>());
  }
  if (behind.empty() || behind.size() == dumps.size()) return;
  const json* at_top = nullptr;
  double first_issued = std::numeric_limits<double>::max();
  for (const auto& [rank, ring] : rings)
    if (auto it = ring.find(top); it != ring.end()) {
      at_top = &it->second;
      first_issued = std::min(first_issued, it->second["issued_unix"].get<double>());
    }
  for (int r : behind) {
    if (waited_when_written(dumps, r, first_issued) < kSettledS) continue;  // it may be on its way there
    const auto& ring = rings.at(r);
    std::string last = ring.empty()
                           ? "none recorded"
                           : describe(ring.rbegin()->second) + ", " + ring.rbegin()->second["state"].get<std::string>();
    std::string phase;
    for (const auto& d : dumps)
      if (d["rank"].get<int>() == r) phase = d["phase"].get<std::string>();
    out.push_back(finding("never_issued", {r},
                          "rank " + std::to_string(r) + " never issued collective " + describe(*at_top) +
                              ", which other ranks did; its last was " + last + ", and it was in phase '" + phase +
                              "' when it wrote its record",
                          static_cast<int64_t>(top)));
  }
}

// Note [Which rank is out of step]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// At the first sequence number whose collectives differ, the ranks' calls alone do not say who is at fault.
// Two things do. The calls that agree: with three ranks or more, those that called what most ranks called
// are the reference, and the others are out of step. And the numbers after it: a rank whose call at #n is
// the reference's #n+k skipped k collectives the others called (a bucket's all-reduce left out); one whose
// #n+k is the reference's #n called k the others did not (a barrier only it entered). These matches
// compare the purpose too ('gradient bucket 1'), as two buckets can be the same size. With two ranks nothing says
// which one is the reference: the shift is stated both ways and the rank is not blamed.
constexpr uint64_t kMaxShift = 4;

// The same collective: op, dtype, element count and purpose.
bool same_call(const json* a, const json* b) {
  return a && b && (*a)["op"] == (*b)["op"] && (*a)["dtype"] == (*b)["dtype"] && (*a)["numel"] == (*b)["numel"] &&
         (*a)["what"] == (*b)["what"];
}

const json* entry_at(const Ring& ring, uint64_t seq) {
  const auto it = ring.find(seq);
  return it == ring.end() ? nullptr : &it->second;
}

// What rank `odd` did at #seq against rank `ref`'s calls (Note [Which rank is out of step]), or "".
std::string shift_between(const std::map<int, Ring>& rings, int odd, int ref, uint64_t seq, bool blame) {
  const Ring &o = rings.at(odd), &r = rings.at(ref);
  const auto calls = [](const Ring& ring, uint64_t from, uint64_t k) {
    std::string s;
    for (uint64_t i = 0; i < k; ++i)
      if (const json* e = entry_at(ring, from + i)) s += (i ? ", " : "") + describe(*e);
    return s;
  };
  const std::string odd_name = "rank " + std::to_string(odd), ref_name = "rank " + std::to_string(ref);
  for (uint64_t k = 1; k <= kMaxShift; ++k) {
    if (same_call(entry_at(o, seq), entry_at(r, seq + k)))
      return blame
                 ? " " + odd_name + " is out of step: it skipped " + calls(r, seq, k) + ", which the others called (" +
                       odd_name + "'s #" + std::to_string(seq) + " is their #" + std::to_string(seq + k) + ")."
                 : " " + odd_name + "'s #" + std::to_string(seq) + " is " + ref_name + "'s #" +
                       std::to_string(seq + k) + ": " + odd_name + " skipped " + calls(r, seq, k) + ", or " + ref_name +
                       " called it in addition (with two ranks the records cannot tell which).";
    if (same_call(entry_at(o, seq + k), entry_at(r, seq)))
      return blame
                 ? " " + odd_name + " is out of step: it called " + calls(o, seq, k) + ", which the others did not (" +
                       odd_name + "'s #" + std::to_string(seq + k) + " is their #" + std::to_string(seq) + ")."
                 : " " + odd_name + "'s #" + std::to_string(seq + k) + " is " + ref_name + "'s #" +
                       std::to_string(seq) + ": " + odd_name + " called " + calls(o, seq, k) + " in addition, or " +
                       ref_name + " skipped it (with two ranks the records cannot tell which).";
  }
  return "";
}

// The first sequence number at which two ranks called different collectives (none: the largest number).
// Past it the ranks' numbers no longer name the same collective, so the findings below stop there.
uint64_t find_differs(const std::map<int, Ring>& rings, json& out) {
  std::map<uint64_t, std::vector<std::pair<int, const json*>>> by_seq;
  for (const auto& [rank, ring] : rings)
    for (const auto& [seq, e] : ring) by_seq[seq].emplace_back(rank, &e);
  for (const auto& [seq, calls] : by_seq) {
    const auto key = [](const json& e) { return e["op"].dump() + e["dtype"].dump() + e["numel"].dump(); };
    const bool same =
        std::all_of(calls.begin(), calls.end(), [&](const auto& c) { return key(*c.second) == key(*calls[0].second); });
    if (same) continue;
    std::vector<int> ranks;
    std::string text = "collective #" + std::to_string(seq) + " differs between ranks:";
    for (const auto& [rank, e] : calls) {
      ranks.push_back(rank);
      text += " rank " + std::to_string(rank) + " called " + describe(*e) + ";";
    }
    text.back() = '.';
    // Note [Which rank is out of step]: the ranks whose call most ranks made are the reference.
    std::map<std::string, std::vector<int>> groups;
    for (const auto& [rank, e] : calls) groups[key(*e) + (*e)["what"].dump()].push_back(rank);
    const auto largest = std::max_element(
        groups.begin(), groups.end(), [](const auto& a, const auto& b) { return a.second.size() < b.second.size(); });
    std::string shift;
    if (2 * largest->second.size() > calls.size()) {
      std::vector<int> odd;
      for (const auto& [rank, e] : calls)
        if (std::find(largest->second.begin(), largest->second.end(), rank) == largest->second.end()) {
          odd.push_back(rank);
          const auto why = shift_between(rings, rank, largest->second.front(), seq, /*blame=*/true);
          // No shift seen (the others' next collectives are not in their records): the majority still says who.
          shift += !why.empty() ? why
                                : " rank " + std::to_string(rank) + " is out of step: " + rank_list(largest->second) +
                                      " called #" + std::to_string(seq) + " as most ranks did.";
        }
      ranks = odd;
    } else if (calls.size() == 2) {
      shift = shift_between(rings, calls[1].first, calls[0].first, seq, /*blame=*/false);
    }
    out.push_back(finding("differs", ranks, text + shift + " Everything after it is out of step (a desync)",
                          static_cast<int64_t>(seq)));
    return seq;
  }
  return std::numeric_limits<uint64_t>::max();
}

// The oldest collective that every rank with a record entered and that did not end everywhere.
void find_never_ended(const std::vector<json>& dumps, const std::map<int, Ring>& rings, uint64_t desync, json& out) {
  std::map<uint64_t, int> entered;
  for (const auto& [rank, ring] : rings)
    for (const auto& [seq, e] : ring) ++entered[seq];
  for (const auto& [seq, count] : entered) {
    if (seq >= desync) return;
    if (count != static_cast<int>(rings.size())) continue;
    std::vector<int> open;
    std::string how;
    bool completed_somewhere = false;
    for (const auto& [rank, ring] : rings) completed_somewhere |= ring.at(seq)["state"] == "completed";
    for (const auto& [rank, ring] : rings) {
      const auto& e = ring.at(seq);
      if (e["state"] == "completed") continue;
      if (e["state"] == "issued" && waited_when_written(dumps, rank, e["issued_unix"].get<double>()) < kSettledS)
        continue;  // in flight when a running rank wrote its record

      // Never waited for, not stalled: it completed on another rank, and a later collective of this
      // rank ended (a broadcast whose handle an error skipped before its wait).
      if (completed_somewhere && e["state"] == "issued" &&
          std::any_of(ring.upper_bound(seq), ring.end(),
                      [](const auto& later) { return later.second["state"] != "issued"; }))
        continue;
      open.push_back(rank);
      if (how.empty() && e.contains("ended_unix"))
        how = "; it " + e["state"].get<std::string>() + " after " +
              std::to_string(static_cast<int>(e["ended_unix"].get<double>() - e["issued_unix"].get<double>())) + " s";
    }
    if (open.empty()) continue;
    const bool whole_job = static_cast<int>(rings.size()) == dumps[0]["world_size"].get<int>();
    out.push_back(finding("never_ended", open,
                          rank_list(open) + " entered collective " + describe(rings.at(open[0]).at(seq)) +
                              " and it never completed there" + how +
                              (whole_job ? ": every rank entered it, so the collective itself stalled or broke "
                                           "(network, or the backend)"
                                         : ": the ranks without a record are the likely cause"),
                          static_cast<int64_t>(seq)));
    return;
  }
}

// The rank the others wait for. Over the collectives every rank completed, whoever issues one last keeps
// the others waiting by its gap to the next-latest; a straggler is the rank that accounts for most of that
// waiting, and enough of it to matter. (It is late only at the collectives that follow its own slow work:
// those right after a synchronizing one start together, so "last in most collectives" would miss it.)
// The length of the union of the intervals (begin, end).
double covered(std::vector<std::pair<double, double>> spans) {
  std::sort(spans.begin(), spans.end());
  double total = 0, begin = 0, end = -std::numeric_limits<double>::infinity();
  for (const auto& [b, e] : spans) {
    if (b > end) {
      if (end > begin) total += end - begin;
      begin = b;
    }
    end = std::max(end, e);
  }
  return end > begin ? total + end - begin : total;
}

// When the rank `issues` belong to stopped to wait for a collective it issued at `issued` and that ended
// at `ended` (Note [When a rank waited for a straggler]).
double began_waiting(const std::vector<double>& issues, double issued, double ended) {
  const auto after = std::upper_bound(issues.begin(), issues.end(), ended);
  return after == issues.begin() ? issued : std::max(issued, *std::prev(after));
}

// Note [When a rank waited for a straggler]
// A collective is open on a rank from its issue to the end of its wait(), but the rank is not waiting
// all that while: DDP issues the buffers' broadcast as backward begins and each bucket's all-reduce as
// its gradients are ready, and computes on until backward ends. It waits from then. The records do not
// say when wait() was called, but a rank that issued another collective later was still running then:
// a rank waits for a collective from the last issue of its own before that collective ended. Counting
// from its issue said a rank 30% slower kept the others waiting 47% of the time, where its cost is 23%:
// the broadcast and each bucket, open through the whole backward, were counted as waiting.
void find_straggler(const std::map<int, Ring>& rings, json& out) {
  if (rings.size() < 2) return;
  std::map<int, std::vector<double>> issues;  // per rank: when it issued each collective it completed, in order
  for (const auto& [rank, ring] : rings) {
    auto& mine = issues[rank];
    for (const auto& [seq, e] : ring)
      if (e["state"] == "completed") mine.push_back(e["issued_unix"].get<double>());
    std::sort(mine.begin(), mine.end());
  }
  std::map<int, std::vector<double>> late;                     // per last rank: its lateness at each
  std::map<int, std::vector<std::pair<double, double>>> held;  // per last rank: when the others waited for it
  std::vector<std::pair<double, double>> all;
  int counted = 0;
  double first = 0, last = 0;
  for (const auto& [seq, e0] : rings.begin()->second) {
    std::vector<std::tuple<double, int, double>> at;  // (issued, rank, ended)
    for (const auto& [rank, ring] : rings)
      if (auto it = ring.find(seq); it != ring.end() && it->second["state"] == "completed")
        at.emplace_back(it->second["issued_unix"].get<double>(), rank, it->second["ended_unix"].get<double>());
    if (at.size() != rings.size()) continue;
    std::sort(at.begin(), at.end());
    if (counted++ == 0) first = std::get<0>(at.front());
    last = std::get<0>(at.back());
    const int straggler = std::get<1>(at.back());
    const auto& [issued, rank, ended] = at[at.size() - 2];
    late[straggler].push_back(last - issued);
    // The next-latest rank waited only if its collective was still open when the last one entered it (a
    // broadcast's root may be done once it has sent), and from when it had nothing else to do (the Note).
    // Collectives in flight together hold it over the same time: a wait counts once, as the union of the
    // intervals. (Summing each collective's gap said 66 to 77% for a rank 30% slower.)
    const double waiting = began_waiting(issues[rank], issued, ended);
    if (ended >= last && last > waiting) {
      held[straggler].emplace_back(waiting, last);
      all.emplace_back(waiting, last);
    }
  }
  const double waited = covered(all);
  if (counted < 20 || waited <= 0) return;
  std::map<int, double> kept_by;
  for (const auto& [rank, spans] : held) kept_by[rank] = covered(spans);
  const auto top = std::max_element(kept_by.begin(), kept_by.end(),
                                    [](const auto& a, const auto& b) { return a.second < b.second; });
  const double kept = top->second, span = last - first;
  // Half a second at least: less is not worth a user's look (a 5-step job's records, 0.1 s of 0.2 s).
  if (kept < 0.75 * waited || kept < 0.5 || kept < 0.02 * span) return;
  auto gaps = late[top->first];
  std::nth_element(gaps.begin(), gaps.begin() + gaps.size() / 2, gaps.end());
  std::ostringstream os;
  os << std::fixed << std::setprecision(1) << "rank " << top->first << " kept the others waiting " << kept
     << " s of the last " << span << " s (" << std::setprecision(0) << 100 * kept / std::max(span, 1e-9)
     << "%): it entered " << gaps.size() << " of " << counted << " collectives last, a median of "
     << std::setprecision(1) << 1000 * gaps[gaps.size() / 2]
     << " ms after the next-latest rank. A straggler: a slower machine, a busier core, or more data work";
  out.push_back(finding("straggler", {top->first}, os.str()));
}

std::string name_list(const std::vector<std::string>& names) {
  std::string s;
  for (size_t i = 0; i < names.size(); ++i) s += (i ? (i + 1 == names.size() ? " and " : ", ") : "") + names[i];
  return s;
}

// Note [A swarm peer's rounds in its record] (FlightRecorder.cpp): the peers that others' rounds found
// silent, from which step, by whom, and what their own records say; then the run dirs without a record.
void find_silent_peers(const std::vector<json>& peers, const std::vector<json>& empty_dirs, json& out) {
  struct Silence {
    std::set<int64_t> steps;
    std::set<std::string> noticed_by;
    bool outer = false;  // DiLoCo's rounds, numbered as outer rounds
  };
  std::map<std::string, Silence> silent;
  for (const auto& p : peers)
    for (const auto& r : p["rounds"])
      for (const auto& name : r["silent"]) {
        auto& s = silent[name.get<std::string>()];
        s.steps.insert(r["step"].get<int64_t>());
        s.noticed_by.insert(p["peer"].get<std::string>());
        s.outer |= r["kind"] == "outer";
      }
  for (const auto& [name, s] : silent) {
    const std::string when = s.outer ? "outer round " : "step ";
    std::string own = ": it left no flight record among these run dirs (stopped, frozen or killed: look there first";
    own += empty_dirs.empty() ? ", or its run dir was not given)" : "; run dirs without one: " + [&] {
      std::vector<std::string> dirs;
      for (const auto& d : empty_dirs) dirs.push_back(d["run_dir"].get<std::string>());
      return name_list(dirs);
    }() + ")";
    for (const auto& p : peers)
      if (p["peer"] == name) {
        const auto& rounds = p["rounds"];
        own = "; its own record (written on " + p["reason"].get<std::string>() + ") " +
              (rounds.empty() ? std::string("holds no round")
                              : "ends at " + when + std::to_string(rounds.back()["step"].get<int64_t>()));
      }
    const std::vector<std::string> by(s.noticed_by.begin(), s.noticed_by.end());
    out.push_back(
        {{"kind", "silent_peer"},
         {"ranks", json::array()},
         {"peers", {name}},
         {"seq", *s.steps.begin()},
         {"text", "swarm peer " + name + " went silent from " + when + std::to_string(*s.steps.begin()) + ": peer" +
                      (by.size() == 1 ? " " : "s ") + name_list(by) + " had no contribution or no result from it in " +
                      std::to_string(s.steps.size()) + " round(s), and went on without it" + own}});
  }
  if (silent.empty())
    for (const auto& d : empty_dirs)
      out.push_back({{"kind", "no_record"},
                     {"ranks", json::array()},
                     {"text", d["run_dir"].get<std::string>() +
                                  " holds no flight record: its process was stopped, frozen or killed, or never had "
                                  "cause to write one"}});
}

json last_rounds(const json& p) {
  json last = json::array();
  const auto& rounds = p["rounds"];
  for (size_t i = rounds.size() > 5 ? rounds.size() - 5 : 0; i < rounds.size(); ++i) last.push_back(rounds[i]);
  return {{"peer", p["peer"]}, {"reason", p["reason"]}, {"phase", p["phase"]}, {"last", last}};
}

void render_rounds(const json& r, std::ostream& os) {
  os << "swarm peer " << r["peer"].get<std::string>() << " (record written on " << r["reason"].get<std::string>()
     << ", in phase '" << r["phase"].get<std::string>() << "'), its last rounds:\n";
  for (const auto& e : r["last"]) {
    std::vector<std::string> group;
    for (const auto& g : e["group"]) group.push_back(g.get<std::string>());
    os << "    step " << e["step"] << " " << e["kind"].get<std::string>() << " with " << name_list(group) << ": "
       << e["state"].get<std::string>();
    if (!e["problem"].get<std::string>().empty()) os << " (" << e["problem"].get<std::string>() << ")";
    os << "\n";
  }
}

}  // namespace

std::vector<json> read_flight_dumps(const std::vector<fs::path>& run_dirs) {
  std::vector<json> dumps;
  for (const auto& dir : run_dirs) {
    const auto flight = dir / "flight";
    std::vector<fs::path> files;
    if (fs::is_directory(flight))
      for (const auto& f : fs::directory_iterator(flight))
        if (f.path().extension() == ".json" && f.path().filename().string().rfind("rank", 0) == 0)
          files.push_back(f.path());
    if (files.empty()) {
      // One of several run dirs (a swarm's peers) without a record is itself a finding.
      dumps.push_back({{"run_dir", dir.string()}, {"no_record", true}});
      continue;
    }
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
      json d;
      try {
        d = json::parse(std::ifstream(f));
      } catch (const std::exception& e) {
        throw Error(f.string() + " is not JSON: " + e.what(), "remove it, or give doctor another run dir");
      }
      if (d.value("format", "") != kFlightFormat || d.value("version", 0) < 1 || d.value("version", 0) > kFlightVersion)
        throw Error(f.string() + " is not a flight record of version 1 to " + std::to_string(kFlightVersion),
                    "it was written by another program or another cohort; remove it");
      d["run_dir"] = dir.string();
      dumps.push_back(std::move(d));
    }
  }
  if (std::all_of(dumps.begin(), dumps.end(), [](const json& d) { return d.contains("no_record"); }))
    throw Error((run_dirs.size() == 1 ? run_dirs[0].string() : "none of the run dirs") +
                    " holds a flight record (flight/rank<R>.json)",
                "ranks write one when a collective fails or times out, when they crash, and on SIGUSR2 (swarm "
                "peers also when a round's member is silent); run doctor on the run dir of a job that failed, "
                "or send the workers SIGUSR2 while it hangs");
  return dumps;
}

json diagnose(const std::vector<json>& all) {
  json findings = json::array();
  // A swarm peer's run dir: its rank 0 holds the peer's rounds, its other ranks (the peer's own local
  // workers) are not ranks of one job with the other peers', so they are not compared with them.
  std::set<std::string> peer_dirs;
  for (const auto& d : all)
    if (d.contains("peer")) peer_dirs.insert(d.value("run_dir", ""));
  std::vector<json> dumps, peers, empty_dirs;
  for (const auto& d : all) {
    if (d.contains("no_record"))
      empty_dirs.push_back(d);
    else if (d.contains("peer"))
      peers.push_back(d);
    else if (!peer_dirs.count(d.value("run_dir", "")))
      dumps.push_back(d);
  }
  if (!peers.empty() || !empty_dirs.empty()) find_silent_peers(peers, empty_dirs, findings);
  find_crashed(peers, findings);
  json ranks = json::array();
  for (const auto& p : peers) ranks.push_back(last_rounds(p));
  if (dumps.empty()) return {{"findings", findings}, {"ranks", ranks}};
  const auto rings = rings_of(dumps);
  find_missing(dumps, findings);
  const uint64_t desync = find_differs(rings, findings);
  find_crashed(dumps, findings);  // after a desync, which a backend may answer with an abort
  find_never_issued(dumps, rings, desync, findings);
  find_never_ended(dumps, rings, desync, findings);
  find_straggler(rings, findings);
  for (const auto& d : dumps) {
    json last = json::array();
    const auto& entries = d["entries"];
    for (size_t i = entries.size() > 5 ? entries.size() - 5 : 0; i < entries.size(); ++i) last.push_back(entries[i]);
    ranks.push_back({{"rank", d["rank"]}, {"reason", d["reason"]}, {"phase", d["phase"]}, {"last", last}});
  }
  return {{"findings", findings}, {"ranks", ranks}};
}

std::string render(const json& diagnosis) {
  std::ostringstream os;
  if (diagnosis["findings"].empty())
    os << "cohort doctor: nothing stands out: every rank with a record issued the same collectives, and none was "
          "stuck in one\n";
  for (const auto& f : diagnosis["findings"]) os << "- " << f["text"].get<std::string>() << "\n";
  for (const auto& r : diagnosis["ranks"]) {
    if (r.contains("peer")) {
      render_rounds(r, os);
      continue;
    }
    os << "rank " << r["rank"] << " (record written on " << r["reason"].get<std::string>() << ", in phase '"
       << r["phase"].get<std::string>() << "'), its last collectives:\n";
    for (const auto& e : r["last"])
      os << "    " << describe(e) << " in " << e["phase"].get<std::string>() << ": " << e["state"].get<std::string>()
         << "\n";
  }
  return os.str();
}

}  // namespace cohort::comm

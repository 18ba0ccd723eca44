// `cohort doctor RUN_DIR...`: reads the flight records the ranks dumped (comm/FlightRecorder.h) side by
// side and says what went wrong: which rank left no record (a stopped or frozen process cannot write one),
// which rank never issued the collective the others waited in and what it was doing instead, collectives
// that differ between ranks at the same sequence number, a collective every rank entered that never
// ended, a rank the others keep waiting for (a straggler), and a rank that crashed. Several run dirs may
// be given: a swarm's peers each have their own, and their records name the peer the others' rounds
// found silent (Note [A swarm peer's rounds in its record] in FlightRecorder.cpp).
//
//   const auto dumps = cohort::comm::read_flight_dumps({"runs/x"});
//   const nlohmann::json d = cohort::comm::diagnose(dumps);      // {"findings": [...], "ranks": [...]}
//   std::cout << cohort::comm::render(d);
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace cohort::comm {

// Every RUN_DIR/flight/rank*.json, checked for the format and version, each with its "run_dir"; a run dir
// without one gives {"run_dir": ..., "no_record": true}. Throws cohort::Error naming a file that is not a
// flight record, or when no run dir holds one (and what writes them).
std::vector<nlohmann::json> read_flight_dumps(const std::vector<std::filesystem::path>& run_dirs);

// Findings, each {"kind": no_record | differs | crashed | never_issued | never_ended | straggler |
// silent_peer, "ranks": [...], "seq": N (where it applies; a swarm step for silent_peer, with "peers"),
// "text": "..."}, most telling first; and per rank its last collectives (per swarm peer its last rounds).
nlohmann::json diagnose(const std::vector<nlohmann::json>& dumps);

// The diagnosis as lines for a person: the findings, then a short timeline per rank.
std::string render(const nlohmann::json& diagnosis);

}  // namespace cohort::comm

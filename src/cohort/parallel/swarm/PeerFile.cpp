// Where a swarm peer listens, written to its run dir for `cohort doctor --ask`, and the doctor's request to
// each peer (parallel/swarm/SwarmPeer.h: PeerFile, write_peer_file, read_peer_file, ask_for_records).
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>

#include <sodium.h>
#include <nlohmann/json.hpp>

#include "cohort/p2p/Transport.h"
#include "cohort/parallel/swarm/SwarmPeer.h"
#include "cohort/util/AtomicFile.h"
#include "cohort/util/Error.h"

namespace cohort::parallel::swarm {

namespace {

constexpr const char* kPeerFileFormat = "cohort-swarm-peer";

p2p::PeerKey key_from_hex(const nlohmann::json& j, const char* name, const std::filesystem::path& path) {
  p2p::PeerKey key{};
  const auto text = j.value(name, std::string());
  size_t len = 0;
  if (text.size() != 64 ||
      sodium_hex2bin(key.data(), key.size(), text.data(), text.size(), nullptr, &len, nullptr) != 0)
    throw Error(path.string() + " has a malformed \"" + name + "\"", "the peer rewrites it when it starts again");
  return key;
}

}  // namespace

// Note [Asking swarm peers for their records]
// A job's ranks are asked through its store (Note [Asking every rank for its record] in
// comm/PeerWatch.cpp); swarm peers share none. So each peer writes where it listens to its run dir at start,
// and `cohort doctor --ask` sends each peer whose run dir it is given a kRecordAsk frame over the swarm's
// own transport, as a holder of a token of the run (the insecure run's is anyone's; an authenticated run's
// is issued for the doctor, never a peer's own: its frames' counters would race that peer's). The peer's
// transport hands the frame to the flight recorder's dump thread, as SIGUSR2 does, on any machine the
// frame reaches. A frozen peer cannot answer, and is named from the others' records, as before.
void write_peer_file(const std::string& run_dir, const p2p::Transport& transport, bool insecure) {
  if (run_dir.empty()) return;
  const nlohmann::json j{{"format", kPeerFileFormat},
                         {"version", 1},
                         {"address", transport.address()},
                         {"peer_public_key", p2p::hex(transport.key().data(), transport.key().size())},
                         {"insecure", insecure}};
  try {
    std::filesystem::create_directories(std::filesystem::path(run_dir) / "flight");
    util::write_file_atomic(std::filesystem::path(run_dir) / "flight" / "swarm.json", j.dump(1) + "\n");
  } catch (const std::exception& e) {
    std::cerr << "cohort: swarm: cannot write " << run_dir << "/flight/swarm.json (cohort doctor --ask will not find "
              << "this peer): " << e.what() << std::endl;
  }
}

std::optional<PeerFile> read_peer_file(const std::filesystem::path& run_dir) {
  const auto path = run_dir / "flight" / "swarm.json";
  std::ifstream in(path);
  if (!in) return std::nullopt;
  const auto j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded() || j.value("format", std::string()) != kPeerFileFormat || j.value("version", 0) != 1)
    throw Error(path.string() + " is not a swarm peer's address file of version 1",
                "the peer rewrites it when it starts again");
  return PeerFile{j.value("address", std::string()), key_from_hex(j, "peer_public_key", path),
                  j.value("insecure", false)};
}

std::unique_ptr<p2p::Transport> ask_for_records(const std::vector<PeerFile>& peers, const p2p::PeerIdentity& identity) {
  // Frames go out through ZeroMQ's connections; nobody answers to this address. Loopback unless a peer is
  // elsewhere.
  const bool local =
      std::all_of(peers.begin(), peers.end(), [](const PeerFile& p) { return p.address.rfind("127.", 0) == 0; });
  auto transport = std::make_unique<p2p::Transport>(identity, identity.token.run_public_key,
                                                    local ? "127.0.0.1:0" : "0.0.0.0:0", [](const std::string&) {});
  for (const auto& p : peers) transport->send(p.peer, p.address, {p2p::MessageKind::kRecordAsk, 0, 0}, {});
  return transport;
}

}  // namespace cohort::parallel::swarm

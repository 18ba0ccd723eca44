// What sealing and opening one swarm frame costs, signed (p2p::seal, Ed25519) against sealed for one peer
// (p2p::seal_for, a MAC under the pair's key: Note [A frame for one peer carries a MAC, not a signature]),
// keyed BLAKE2b ("mac") and a Poly1305 tag ("poly1305", Note [A frame for one peer carries a Poly1305 tag]),
// by payload size: a record's frame is a few hundred bytes, an averaging part of the MLP about 27 KB, a
// ResNet-50 part megabytes. Medians of 5 laps, microseconds per frame, one thread.
//
//   build/bench/frame_cost      # prints one JSON object
#include <algorithm>
#include <chrono>
#include <ctime>
#include <iostream>
#include <vector>

#include <nlohmann/json.hpp>

#include "cohort/p2p/Auth.h"

namespace p2p = cohort::p2p;

namespace {

// Median microseconds per call of `fn` over 5 laps of `n` calls.
template <typename Fn>
double median_us(int n, Fn&& fn) {
  std::vector<double> laps;
  for (int lap = 0; lap < 5; ++lap) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) fn();
    laps.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / n);
  }
  std::sort(laps.begin(), laps.end());
  return laps[laps.size() / 2];
}

}  // namespace

int main() {
  const auto now = static_cast<int64_t>(std::time(nullptr));
  const auto run = p2p::generate_run_key();
  const auto alice = p2p::issue_token(run, std::chrono::hours(1), now);
  const auto bob = p2p::issue_token(run, std::chrono::hours(1), now);
  const auto& to = bob.token.peer_public_key;
  nlohmann::json rows = nlohmann::json::array();
  for (size_t bytes : {256, 4096, 32768, 1 << 20}) {
    const std::vector<uint8_t> payload(bytes, 7);
    const int n = bytes >= (1 << 20) ? 20 : 400;
    const auto signed_frame = p2p::seal(alice, to, 1, payload);
    const auto mac_frame = p2p::seal_for(alice, to, 1, payload, p2p::PairMac::kBlake2b);
    const auto poly_frame = p2p::seal_for(alice, to, 1, payload, p2p::PairMac::kPoly1305);
    const auto opens = [&](const std::vector<uint8_t>& f) {
      auto o = p2p::open(f.data(), f.size(), run.public_key, now, &bob);
      if (!std::holds_alternative<p2p::Opened>(o)) std::abort();
    };
    const double seal_signed = median_us(n, [&] { p2p::seal(alice, to, 1, payload); });
    const double seal_mac = median_us(n, [&] { p2p::seal_for(alice, to, 1, payload, p2p::PairMac::kBlake2b); });
    const double seal_poly = median_us(n, [&] { p2p::seal_for(alice, to, 1, payload, p2p::PairMac::kPoly1305); });
    const double open_signed = median_us(n, [&] { opens(signed_frame); });
    const double open_mac = median_us(n, [&] { opens(mac_frame); });
    const double open_poly = median_us(n, [&] { opens(poly_frame); });
    // "mac": the keyed BLAKE2b of "CSW2" frames (the previous release's, and earlier results' "mac");
    // "poly1305": the Poly1305 tag of "CSW3" frames.
    rows.push_back({{"payload_bytes", bytes},
                    {"seal_us", {{"signed", seal_signed}, {"mac", seal_mac}, {"poly1305", seal_poly}}},
                    {"open_us", {{"signed", open_signed}, {"mac", open_mac}, {"poly1305", open_poly}}},
                    {"seal_and_open_ratio_mac_over_signed", (seal_mac + open_mac) / (seal_signed + open_signed)},
                    {"seal_and_open_ratio_poly1305_over_mac", (seal_poly + open_poly) / (seal_mac + open_mac)}});
  }
  std::cout << nlohmann::json{{"bench", "frame_cost"},
                              {"unit", "microseconds per frame, median of 5 laps"},
                              {"rows", rows}}
                   .dump(2)
            << std::endl;
}

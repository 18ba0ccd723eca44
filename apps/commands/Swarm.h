// `cohort swarm keygen | token | status`: the swarm's credentials (a key per run, a token per peer signed
// with it) and the list of its live peers. main.cpp adds them to the CLI and runs the one given.
//
//   apps::SwarmCommands swarm;
//   apps::add_swarm_commands(app, swarm);
//   app.parse(argc, argv);
//   if (const int rc = apps::run_swarm_commands(swarm); rc >= 0) return rc;
#pragma once

#include <string>

#include <CLI/CLI.hpp>

namespace apps {

struct SwarmCommands {
  CLI::App* keygen = nullptr;
  CLI::App* token = nullptr;
  CLI::App* status = nullptr;
  std::string key_out, token_key, token_ttl = "24h", token_out;
  std::string status_peers, status_token;
  bool status_insecure = false;
  double status_wait = 3;
};

void add_swarm_commands(CLI::App& app, SwarmCommands& c);
// The exit code of the swarm command given; -1 when none was. Throws cohort::Error for bad input.
int run_swarm_commands(const SwarmCommands& c);

}  // namespace apps

#include "Swarm.h"

#include <ctime>
#include <iomanip>
#include <iostream>

#include "cohort/p2p/Auth.h"
#include "cohort/util/Error.h"
#if COHORT_HAVE_SWARM
#include "cohort/parallel/swarm/SwarmPeer.h"
#endif

namespace apps {

namespace {

// `cohort swarm status`: one line per live peer.
int print_swarm_status(const SwarmCommands& c) {
#if COHORT_HAVE_SWARM
  cohort::SwarmConfig cfg;
  cfg.token = c.status_token;
  cfg.insecure = c.status_insecure;
  const auto seen = cohort::parallel::swarm::survey(cfg, c.status_peers, c.status_wait);
  std::cout << seen.size() << " live peer(s) besides this observer\n";
  std::cout << std::left << std::setw(10) << "peer" << std::setw(24) << "address" << std::setw(8) << "step"
            << std::setw(10) << "samples"
            << "samples/s\n";
  for (const auto& p : seen)
    std::cout << std::left << std::setw(10) << cohort::p2p::peer_name(p.key) << std::setw(24) << p.address
              << std::setw(8) << p.step << std::setw(10) << p.samples << std::fixed << std::setprecision(1)
              << p.samples_per_s << (p.ready ? "  (ready)" : "") << "\n";
  return 0;
#else
  (void)c;
  throw cohort::ConfigError("cohort swarm status needs the swarm, which this cohort was built without (no OpenDHT)",
                            "build cohort where libopendht-dev is installed (Debian 12)");
#endif
}

}  // namespace

void add_swarm_commands(CLI::App& app, SwarmCommands& c) {
  auto* swarm = app.add_subcommand("swarm", "the swarm's credentials: a run key and the tokens its peers need");
  swarm->require_subcommand(1);
  c.keygen = swarm->add_subcommand("keygen", "make the run's key (keep it secret: it signs every peer's token)");
  c.keygen->add_option("--out", c.key_out, "where the key goes (written with mode 0600)")->required();
  c.token = swarm->add_subcommand("token", "issue a token for one peer, signed with the run key");
  c.token->add_option("--key", c.token_key, "the run key (cohort swarm keygen)")->required()->check(CLI::ExistingFile);
  c.token->add_option("--ttl", c.token_ttl, "how long the token is valid: 90s, 15m, 24h, 7d")->capture_default_str();
  c.token->add_option("--out", c.token_out, "where the token goes (mode 0600); give it to the peer as swarm.token")
      ->required();
  c.status = swarm->add_subcommand("status", "list the swarm's live peers: address, step, samples/s");
  c.status->add_option("--peers", c.status_peers, "HOST:PORT of any live peer (comma-separated for several)")
      ->required();
  c.status->add_option("--token", c.status_token, "a token of the run (cohort swarm token), as swarm.token");
  c.status->add_flag("--insecure", c.status_insecure, "the run has no authentication (swarm.insecure=true)");
  c.status->add_option("--wait", c.status_wait, "seconds to listen to the DHT")->capture_default_str();
}

int run_swarm_commands(const SwarmCommands& c) {
  namespace p2p = cohort::p2p;
  if (*c.keygen) {
    p2p::save_run_key(p2p::generate_run_key(), c.key_out);
    std::cout << "cohort: run key written to " << c.key_out
              << "; issue each peer a token with: cohort swarm token --key " << c.key_out
              << " --ttl 24h --out peer.token" << std::endl;
    return 0;
  }
  if (*c.token) {
    const auto identity =
        p2p::issue_token(p2p::load_run_key(c.token_key), p2p::parse_ttl(c.token_ttl), std::time(nullptr));
    p2p::save_identity(identity, c.token_out);
    std::cout << "cohort: token for peer " << p2p::peer_name(identity.token.peer_public_key) << ", valid for "
              << c.token_ttl << ", written to " << c.token_out << "; pass it as swarm.token=" << c.token_out
              << std::endl;
    return 0;
  }
  if (*c.status) return print_swarm_status(c);
  return -1;
}

}  // namespace apps

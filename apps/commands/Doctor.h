// `cohort doctor RUN_DIR... [--json] [--ask [--wait S]]`: what went wrong in a job that failed or hung,
// from the flight records its ranks wrote (comm/Doctor.h). With --ask, the job is running (hung, or
// crawling): every rank is first asked for a fresh record through the job's store (Note [Asking every rank
// for its record] in comm/PeerWatch.cpp), or, for swarm peers' run dirs, each peer over the swarm's
// transport (Note [Asking swarm peers for their records] in parallel/swarm/SwarmPeer.cpp). main.cpp adds
// it to the CLI and runs it when given.
//
//   apps::DoctorCommand doctor;
//   apps::add_doctor_command(app, doctor);
//   app.parse(argc, argv);
//   if (const int rc = apps::run_doctor_command(doctor); rc >= 0) return rc;
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace apps {

struct DoctorCommand {
  CLI::App* app = nullptr;
  std::vector<std::string> run_dirs;
  bool json = false;
  bool ask = false;
  double wait_s = 10;
  std::string token_file;
  std::string swarm_token;  // with --ask, for an authenticated swarm: a token of its run for the doctor
};

void add_doctor_command(CLI::App& app, DoctorCommand& c);
// 0 when nothing stands out, 1 when the diagnosis has findings; -1 when the command was not given.
// Throws cohort::Error for a run dir without flight records, or, with --ask, a job whose store does not
// answer.
int run_doctor_command(const DoctorCommand& c);

}  // namespace apps

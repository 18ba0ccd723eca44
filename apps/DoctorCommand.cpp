#include "DoctorCommand.h"

#include <iostream>

#include "cohort/comm/Doctor.h"

void add_doctor_command(CLI::App& app, DoctorCommand& c) {
  c.app = app.add_subcommand("doctor",
                             "what went wrong in a failed or hung job: reads the flight records its ranks wrote "
                             "(RUN_DIR/flight/) side by side; several run dirs for swarm peers");
  c.app->add_option("run_dirs", c.run_dirs, "run directories")->required();
  c.app->add_flag("--json", c.json, "print the diagnosis as JSON");
}

int run_doctor_command(const DoctorCommand& c) {
  if (!c.app || !*c.app) return -1;
  std::vector<std::filesystem::path> dirs(c.run_dirs.begin(), c.run_dirs.end());
  const auto diagnosis = cohort::comm::diagnose(cohort::comm::read_flight_dumps(dirs));
  if (c.json)
    std::cout << diagnosis.dump(2) << std::endl;
  else
    std::cout << cohort::comm::render(diagnosis);
  return diagnosis["findings"].empty() ? 0 : 1;
}

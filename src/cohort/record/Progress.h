// Rank 0's progress display: a live bar with ETA, loss and images/s redrawn in place when stdout is a
// terminal (as Lightning's TQDM bar), and plain lines every `log.every_steps` when it is not (CI, log
// files, `| tee`), so logs never fill with carriage returns.
//
//   cohort::record::Progress p(cohort::record::Progress::resolve("auto", isatty(1)), std::cout);
//   p.update({...});          // every step; redraws at most 10 times a second
//   p.end_epoch();            // leaves the finished bar on its own line
#pragma once

#include <chrono>
#include <cstdint>
#include <ostream>
#include <string>

namespace cohort::record {

struct ProgressState {
  int64_t epoch = 0;  // 0-based
  int64_t epochs = 1;
  int64_t step_in_epoch = 0;  // steps done in this epoch
  int64_t steps_per_epoch = 1;
  int64_t step = 0;  // steps done in the run
  int64_t total_steps = 1;
  double loss = 0;
  double images_per_second = 0;
  double elapsed_s = 0;            // since this process started training
  int64_t steps_this_session = 0;  // steps this process ran (a resumed run starts at 0)
};

class Progress {
 public:
  enum class Mode { kBar, kPlain, kOff };
  // "auto" picks the bar on a terminal and plain lines elsewhere.
  static Mode resolve(const std::string& setting, bool stdout_is_terminal);

  Progress(Mode mode, std::ostream& out) : mode_(mode), out_(out) {}
  Mode mode() const { return mode_; }
  void update(const ProgressState& s);
  // Ends the current bar line (bar mode), so what follows starts on a fresh line.
  void end_epoch();
  // Prints a line of its own without breaking the bar.
  void line(const std::string& text);

  // One bar line of about `width` columns, e.g.
  // "epoch 2/3 [#######........]  45% 211/469 loss 0.4321 612 img/s 00:31<00:38"
  static std::string render(const ProgressState& s, int width);
  // "1:02:03", "05:09": the ETA and elapsed format tqdm uses.
  static std::string clock(double seconds);

 private:
  Mode mode_;
  std::ostream& out_;
  bool bar_open_ = false;
  std::chrono::steady_clock::time_point last_draw_{};
};

}  // namespace cohort::record

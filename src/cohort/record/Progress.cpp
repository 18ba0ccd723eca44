#include "cohort/record/Progress.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace cohort::record {

Progress::Mode Progress::resolve(const std::string& setting, bool stdout_is_terminal) {
  if (setting == "bar") return Mode::kBar;
  if (setting == "plain") return Mode::kPlain;
  if (setting == "off") return Mode::kOff;
  return stdout_is_terminal ? Mode::kBar : Mode::kPlain;
}

std::string Progress::clock(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto t = static_cast<int64_t>(seconds + 0.5);
  char buf[32];
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", static_cast<long long>(t / 3600),
                  static_cast<long long>(t / 60 % 60), static_cast<long long>(t % 60));
  else
    std::snprintf(buf, sizeof buf, "%02lld:%02lld", static_cast<long long>(t / 60), static_cast<long long>(t % 60));
  return buf;
}

std::string Progress::render(const ProgressState& s, int width) {
  // The ETA counts only this process's steps: a resumed run's earlier steps took no time here.
  const double per_step = s.steps_this_session > 0 ? s.elapsed_s / s.steps_this_session : NAN;
  const double eta = per_step * static_cast<double>(s.total_steps - s.step);
  const double frac = s.steps_per_epoch > 0 ? double(s.step_in_epoch) / double(s.steps_per_epoch) : 0;
  std::ostringstream head, tail;
  head << "epoch " << s.epoch + 1 << "/" << s.epochs << " ";
  char pct[8];
  std::snprintf(pct, sizeof pct, "%3d%%", static_cast<int>(frac * 100));
  char nums[96];
  std::snprintf(nums, sizeof nums, " %s %lld/%lld loss %.4f %.0f img/s %s<%s", pct,
                static_cast<long long>(s.step_in_epoch), static_cast<long long>(s.steps_per_epoch), s.loss,
                s.images_per_second, clock(s.elapsed_s).c_str(), clock(eta).c_str());
  tail << nums;
  const int bar = std::max(10, width - static_cast<int>(head.str().size() + tail.str().size()) - 2);
  const int filled = std::clamp(static_cast<int>(frac * bar), 0, bar);
  return head.str() + "[" + std::string(filled, '#') + std::string(bar - filled, '.') + "]" + tail.str();
}

void Progress::update(const ProgressState& s) {
  if (mode_ != Mode::kBar) return;
  const auto now = std::chrono::steady_clock::now();
  const bool last = s.step_in_epoch == s.steps_per_epoch;
  if (!last && bar_open_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  winsize ws{};
  const int cols = ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0 ? ws.ws_col : 100;
  // \r returns to the line's start, \033[K clears what a longer previous line left behind.
  out_ << "\r" << render(s, std::min(cols - 1, 120)) << "\033[K" << std::flush;
  bar_open_ = true;
}

void Progress::end_epoch() {
  if (bar_open_) out_ << "\n" << std::flush;
  bar_open_ = false;
}

void Progress::line(const std::string& text) {
  if (mode_ == Mode::kOff) return;
  if (bar_open_) out_ << "\r\033[K";
  out_ << text << std::endl;
  if (bar_open_) last_draw_ = {};  // redraw the bar below on the next update
  bar_open_ = false;
}

}  // namespace cohort::record

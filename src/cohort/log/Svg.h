// Line plots as standalone SVG files, for the run logbook: axes with round-number ticks, one coloured
// polyline (with point markers) per series, and a legend. Browsers, GitHub and VS Code render them.
//
//   cohort::log::LinePlot p{"Loss", "epoch", "loss", {{"train", {{0.5, 2.1}, {1.0, 1.4}}}}};
//   std::ofstream("loss.svg") << cohort::log::render_svg(p);
//
// Why our own code: Debian has no C++ plotting library that writes SVG without a display stack
// (gnuplot would be a run-time program to find and drive); a line chart is a hundred lines.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace cohort::log {

struct Series {
  std::string name;
  std::vector<std::pair<double, double>> points;  // (x, y); non-finite points are skipped
};

struct LinePlot {
  std::string title;
  std::string x_label;
  std::string y_label;
  std::vector<Series> series;
};

std::string render_svg(const LinePlot& plot, int width = 640, int height = 400);

// Horizontal bars split into coloured segments, each bar scaled to 100% of its own total: where each
// run's time went (cohort report's time_breakdown.svg).
struct StackedBars {
  std::string title;
  std::vector<std::string> segments;                              // legend, in segment order
  std::vector<std::pair<std::string, std::vector<double>>> bars;  // label, one value per segment
};

std::string render_svg(const StackedBars& plot, int width = 640);

// Round tick positions covering [lo, hi] (1, 2 or 5 times a power of ten apart), about `count` of them.
std::vector<double> nice_ticks(double lo, double hi, int count = 5);

}  // namespace cohort::log

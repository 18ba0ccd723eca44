#include "cohort/log/Svg.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

namespace cohort::log {

namespace {

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", std::abs(v) < 1e-12 ? 0.0 : v);
  return buf;
}

// The document, a white background and the title: how every plot begins.
void open_svg(std::ostringstream& o, int width, int height, const std::string& title) {
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height << "\" viewBox=\"0 0 "
    << width << " " << height << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
    << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    << "<text x=\"" << width / 2 << "\" y=\"20\" text-anchor=\"middle\" font-size=\"14\">" << escape(title)
    << "</text>\n";
}

// Colour-blind-safe palette (Okabe and Ito).
const char* kColors[] = {"#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442"};

}  // namespace

std::vector<double> nice_ticks(double lo, double hi, int count) {
  if (!(hi > lo)) {
    hi = lo + 1;
  }
  const double raw = (hi - lo) / std::max(1, count);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (raw <= m * mag) {
      step = m * mag;
      break;
    }
  std::vector<double> ticks;
  for (double t = std::floor(lo / step) * step; t <= hi + step * 1e-9; t += step) ticks.push_back(t);
  if (ticks.back() < hi) ticks.push_back(ticks.back() + step);
  return ticks;
}

std::string render_svg(const LinePlot& plot, int width, int height) {
  double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y0 = x0, y1 = -x0;
  for (const auto& s : plot.series)
    for (const auto& [x, y] : s.points) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, y), y1 = std::max(y1, y);
    }
  if (!std::isfinite(x0)) x0 = 0, x1 = 1, y0 = 0, y1 = 1;
  const auto xt = nice_ticks(x0, x1), yt = nice_ticks(y0, y1);
  x0 = xt.front(), x1 = xt.back(), y0 = yt.front(), y1 = yt.back();
  const double left = 64, right = width - 150, top = 36, bottom = height - 48;
  auto px = [&](double x) { return left + (x - x0) / (x1 - x0) * (right - left); };
  auto py = [&](double y) { return bottom - (y - y0) / (y1 - y0) * (bottom - top); };

  std::ostringstream o;
  open_svg(o, width, height, plot.title);
  for (double t : xt)
    o << "<line x1=\"" << px(t) << "\" y1=\"" << top << "\" x2=\"" << px(t) << "\" y2=\"" << bottom
      << "\" stroke=\"#e0e0e0\"/>\n<text x=\"" << px(t) << "\" y=\"" << bottom + 16 << "\" text-anchor=\"middle\">"
      << num(t) << "</text>\n";
  for (double t : yt)
    o << "<line x1=\"" << left << "\" y1=\"" << py(t) << "\" x2=\"" << right << "\" y2=\"" << py(t)
      << "\" stroke=\"#e0e0e0\"/>\n<text x=\"" << left - 6 << "\" y=\"" << py(t) + 4 << "\" text-anchor=\"end\">"
      << num(t) << "</text>\n";
  o << "<rect x=\"" << left << "\" y=\"" << top << "\" width=\"" << right - left << "\" height=\"" << bottom - top
    << "\" fill=\"none\" stroke=\"#444\"/>\n"
    << "<text x=\"" << (left + right) / 2 << "\" y=\"" << height - 10 << "\" text-anchor=\"middle\">"
    << escape(plot.x_label) << "</text>\n"
    << "<text transform=\"translate(16," << (top + bottom) / 2 << ") rotate(-90)\" text-anchor=\"middle\">"
    << escape(plot.y_label) << "</text>\n";
  for (size_t i = 0; i < plot.series.size(); ++i) {
    const auto& s = plot.series[i];
    const char* color = kColors[i % (sizeof kColors / sizeof *kColors)];
    o << "<polyline fill=\"none\" stroke=\"" << color << "\" stroke-width=\"2\" points=\"";
    for (const auto& [x, y] : s.points)
      if (std::isfinite(x) && std::isfinite(y)) o << px(x) << "," << py(y) << " ";
    o << "\"/>\n";
    for (const auto& [x, y] : s.points)
      if (std::isfinite(x) && std::isfinite(y))
        o << "<circle cx=\"" << px(x) << "\" cy=\"" << py(y) << "\" r=\"2.5\" fill=\"" << color << "\"/>\n";
    const double ly = top + 8 + 18.0 * i;
    o << "<line x1=\"" << right + 12 << "\" y1=\"" << ly << "\" x2=\"" << right + 32 << "\" y2=\"" << ly
      << "\" stroke=\"" << color << "\" stroke-width=\"2\"/>\n<text x=\"" << right + 38 << "\" y=\"" << ly + 4 << "\">"
      << escape(s.name) << "</text>\n";
  }
  o << "</svg>\n";
  return o.str();
}

std::string render_svg(const StackedBars& plot, int width) {
  const double left = 150, right = width - 20, top = 36, bar_h = 22, gap = 10;
  const double bottom = top + plot.bars.size() * (bar_h + gap);
  const int legend_rows = static_cast<int>((plot.segments.size() + 3) / 4);
  const int height = static_cast<int>(bottom + 30 + 18 * legend_rows);
  std::ostringstream o;
  open_svg(o, width, height, plot.title);
  for (size_t b = 0; b < plot.bars.size(); ++b) {
    const auto& [label, values] = plot.bars[b];
    double total = 0;
    for (double v : values) total += std::isfinite(v) && v > 0 ? v : 0;
    const double y = top + b * (bar_h + gap);
    o << "<text x=\"" << left - 6 << "\" y=\"" << y + bar_h / 2 + 4 << "\" text-anchor=\"end\">" << escape(label)
      << "</text>\n";
    double x = left;
    for (size_t i = 0; i < values.size() && total > 0; ++i) {
      if (!(std::isfinite(values[i]) && values[i] > 0)) continue;
      const double w = values[i] / total * (right - left);
      o << "<rect x=\"" << x << "\" y=\"" << y << "\" width=\"" << w << "\" height=\"" << bar_h << "\" fill=\""
        << kColors[i % (sizeof kColors / sizeof *kColors)] << "\"><title>"
        << escape(i < plot.segments.size() ? plot.segments[i] : "") << " " << num(100 * values[i] / total)
        << "%</title></rect>\n";
      x += w;
    }
  }
  for (size_t i = 0; i < plot.segments.size(); ++i) {
    const double lx = left + (i % 4) * (right - left) / 4, ly = bottom + 14 + 18.0 * (i / 4);
    o << "<rect x=\"" << lx << "\" y=\"" << ly - 9 << "\" width=\"12\" height=\"12\" fill=\""
      << kColors[i % (sizeof kColors / sizeof *kColors)] << "\"/><text x=\"" << lx + 18 << "\" y=\"" << ly + 2 << "\">"
      << escape(plot.segments[i]) << "</text>\n";
  }
  o << "</svg>\n";
  return o.str();
}

}  // namespace cohort::log

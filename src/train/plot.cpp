#include "train/plot.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

namespace quiver::train {

namespace {

// Matplotlib's "tab10" colours, one per series in turn.
constexpr const char* kPalette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

std::string xml_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

struct Range {
  double lo = std::numeric_limits<double>::infinity();
  double hi = -std::numeric_limits<double>::infinity();
  void add(double v) {
    if (!std::isfinite(v)) return;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  bool empty() const { return lo > hi; }
};

}  // namespace

Ticks nice_ticks(double lo, double hi, int target) {
  if (!std::isfinite(lo) || !std::isfinite(hi) || lo > hi) {
    lo = 0;
    hi = 1;
  }
  if (lo == hi) {
    const double pad = lo == 0 ? 1.0 : std::abs(lo) * 0.1;
    lo -= pad;
    hi += pad;
  }
  target = std::max(target, 2);
  const double raw = (hi - lo) / target;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  const double normalized = raw / magnitude;
  const double nice = normalized < 1.5 ? 1 : normalized < 3 ? 2 : normalized < 7 ? 5 : 10;
  Ticks t;
  t.step = nice * magnitude;
  // A little slack so that a bound sitting on a tick (up to rounding) does not add one more.
  const double slack = 1e-9;
  const int64_t first = static_cast<int64_t>(std::floor(lo / t.step + slack));
  const int64_t last = static_cast<int64_t>(std::ceil(hi / t.step - slack));
  for (int64_t k = first; k <= last; ++k) t.values.push_back(static_cast<double>(k) * t.step);
  return t;
}

std::string format_tick(double value, double step, double axis_max) {
  if (std::abs(value) < std::abs(step) * 1e-9) return "0";
  const double a = std::abs(axis_max);
  double divisor = 1;
  const char* suffix = "";
  if (a >= 1e9) {
    divisor = 1e9;
    suffix = "G";
  } else if (a >= 1e6) {
    divisor = 1e6;
    suffix = "M";
  } else if (a >= 1e4) {
    divisor = 1e3;
    suffix = "k";
  }
  const double scaled_step = std::abs(step) / divisor;
  const int decimals = std::max(0, static_cast<int>(-std::floor(std::log10(scaled_step) + 1e-9)));
  return fmt::format("{:.{}f}{}", value / divisor, decimals, suffix);
}

std::string render_svg(const std::vector<PlotSeries>& series, const PlotOptions& options) {
  Range xr, yr;
  for (const PlotSeries& s : series) {
    const size_t n = std::min(s.x.size(), s.y.size());
    for (size_t i = 0; i < n; ++i) {
      if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) continue;
      xr.add(s.x[i]);
      yr.add(s.y[i]);
    }
  }
  if (xr.empty()) xr = Range{0, 1};
  if (yr.empty()) yr = Range{0, 1};
  const Ticks xt = nice_ticks(xr.lo, xr.hi, 6);
  const Ticks yt = nice_ticks(yr.lo, yr.hi, 6);
  const double x0 = xt.values.front(), x1 = xt.values.back();
  const double y0 = yt.values.front(), y1 = yt.values.back();

  const double W = options.width, Hpx = options.height;
  const double left = 72, right = 24, top = options.title.empty() ? 20 : 44, bottom = 56;
  const double pw = W - left - right, ph = Hpx - top - bottom;
  auto px = [&](double x) { return left + (x - x0) / (x1 - x0) * pw; };
  auto py = [&](double y) { return top + ph - (y - y0) / (y1 - y0) * ph; };

  std::string out;
  out += fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n",
      options.width, options.height);
  out += fmt::format("<rect width=\"{}\" height=\"{}\" fill=\"white\"/>\n", options.width, options.height);
  if (!options.title.empty())
    out += fmt::format("<text x=\"{:.2f}\" y=\"26\" text-anchor=\"middle\" font-size=\"15\">{}</text>\n",
                       left + pw / 2, xml_escape(options.title));

  for (double v : xt.values) {
    const double x = px(v);
    out += fmt::format(
        "<g class=\"x-tick\"><line x1=\"{0:.2f}\" y1=\"{1:.2f}\" x2=\"{0:.2f}\" y2=\"{2:.2f}\" "
        "stroke=\"#e0e0e0\"/><text x=\"{0:.2f}\" y=\"{3:.2f}\" text-anchor=\"middle\" "
        "data-value=\"{4}\">{5}</text></g>\n",
        x, top, top + ph, top + ph + 18, v, format_tick(v, xt.step, std::max(std::abs(x0), std::abs(x1))));
  }
  for (double v : yt.values) {
    const double y = py(v);
    out += fmt::format(
        "<g class=\"y-tick\"><line x1=\"{0:.2f}\" y1=\"{1:.2f}\" x2=\"{2:.2f}\" y2=\"{1:.2f}\" "
        "stroke=\"#e0e0e0\"/><text x=\"{3:.2f}\" y=\"{4:.2f}\" text-anchor=\"end\" "
        "data-value=\"{5}\">{6}</text></g>\n",
        left, y, left + pw, left - 6, y + 4, v, format_tick(v, yt.step, std::max(std::abs(y0), std::abs(y1))));
  }
  out += fmt::format("<rect x=\"{:.2f}\" y=\"{:.2f}\" width=\"{:.2f}\" height=\"{:.2f}\" fill=\"none\" "
                     "stroke=\"black\"/>\n",
                     left, top, pw, ph);
  if (!options.x_label.empty())
    out += fmt::format("<text x=\"{:.2f}\" y=\"{:.2f}\" text-anchor=\"middle\">{}</text>\n", left + pw / 2,
                       Hpx - 14, xml_escape(options.x_label));
  if (!options.y_label.empty())
    out += fmt::format(
        "<text x=\"18\" y=\"{0:.2f}\" text-anchor=\"middle\" transform=\"rotate(-90 18 {0:.2f})\">{1}</text>\n",
        top + ph / 2, xml_escape(options.y_label));

  for (size_t k = 0; k < series.size(); ++k) {
    const PlotSeries& s = series[k];
    const char* color = kPalette[k % std::size(kPalette)];
    const std::string label = xml_escape(s.label);
    const size_t n = std::min(s.x.size(), s.y.size());
    std::string points;
    auto flush = [&] {
      if (!points.empty())
        out += fmt::format(
            "<polyline class=\"series\" data-label=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.6\" "
            "points=\"{}\"/>\n",
            label, color, points);
      points.clear();
    };
    for (size_t i = 0; i < n; ++i) {
      if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) {
        flush();
        continue;
      }
      points += fmt::format("{}{:.2f},{:.2f}", points.empty() ? "" : " ", px(s.x[i]), py(s.y[i]));
      if (s.markers)
        out += fmt::format("<circle cx=\"{:.2f}\" cy=\"{:.2f}\" r=\"2.5\" fill=\"{}\"/>\n", px(s.x[i]),
                           py(s.y[i]), color);
    }
    flush();
  }

  // Legend in the top-right corner of the plot area.
  if (!series.empty()) {
    size_t longest = 0;
    for (const PlotSeries& s : series) longest = std::max(longest, s.label.size());
    const double box_w = 34 + 7.0 * static_cast<double>(longest), row_h = 18;
    const double bx = left + pw - box_w - 8, by = top + 8;
    out += fmt::format("<g class=\"legend\"><rect x=\"{:.2f}\" y=\"{:.2f}\" width=\"{:.2f}\" height=\"{:.2f}\" "
                       "fill=\"white\" fill-opacity=\"0.85\" stroke=\"#999\"/>\n",
                       bx, by, box_w, row_h * static_cast<double>(series.size()) + 6);
    for (size_t k = 0; k < series.size(); ++k) {
      const double y = by + 3 + row_h * (static_cast<double>(k) + 0.5);
      out += fmt::format(
          "<line x1=\"{:.2f}\" y1=\"{:.2f}\" x2=\"{:.2f}\" y2=\"{:.2f}\" stroke=\"{}\" stroke-width=\"2\"/>"
          "<text x=\"{:.2f}\" y=\"{:.2f}\">{}</text>\n",
          bx + 6, y, bx + 26, y, kPalette[k % std::size(kPalette)], bx + 30, y + 4,
          xml_escape(series[k].label));
    }
    out += "</g>\n";
  }
  out += "</svg>\n";
  return out;
}

}  // namespace quiver::train

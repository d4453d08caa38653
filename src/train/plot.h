// Line plots as standalone SVG: axes with "nice" ticks (1, 2, 5 × 10^k), grid, axis labels,
// a title and a legend. Written by hand because the plots are simple and no C++ plotting
// library is packaged here; the output opens in any browser.
#pragma once
#include <string>
#include <vector>

namespace quiver::train {

struct PlotSeries {
  std::string label;
  std::vector<double> x, y;  // same length; non-finite points break the line
  bool markers = false;      // draw a dot at each point (for sparse series such as val loss)
};

struct PlotOptions {
  std::string title;
  std::string x_label, y_label;
  int width = 800, height = 480;
};

// Tick values covering [lo, hi]: multiples of a step of 1, 2 or 5 × 10^k, about `target`
// of them; the first tick is ≤ lo and the last ≥ hi. lo == hi is widened around the value.
struct Ticks {
  double step = 1;
  std::vector<double> values;
};
Ticks nice_ticks(double lo, double hi, int target = 6);

// A tick label: plain decimals with as many digits as the step needs, and a k / M / G suffix
// chosen by the axis's largest |tick| (axis_max ≥ 1e4, 1e6, 1e9), so that one axis uses one
// suffix ("0.5M", "1.0M", "1.5M").
std::string format_tick(double value, double step, double axis_max);

// The plot as an SVG document. Element classes for tools and tests: "x-tick" / "y-tick"
// groups (a line and a text whose data-value attribute holds the exact tick value), one
// "series" polyline per unbroken run of points with data-label naming its series, "legend".
std::string render_svg(const std::vector<PlotSeries>& series, const PlotOptions& options);

}  // namespace quiver::train

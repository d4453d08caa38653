#include "core/progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cmath>

namespace quiver {
namespace {

constexpr double kTerminalInterval_s = 0.1;
constexpr double kLogInterval_s = 5.0;

std::string with_unit(const std::string& number, const std::string& unit) {
  if (unit.empty()) return number;
  return unit.size() <= 2 ? number + unit : number + " " + unit;
}

}  // namespace

std::string human_count(double value) {
  const char* suffixes[] = {"", "K", "M", "G", "T", "P"};
  int k = 0;
  double v = std::fabs(value);
  while (v >= 999.5 && k < 5) {
    v /= 1000;
    ++k;
  }
  const double shown = std::copysign(v, value);
  if (k == 0) return fmt::format("{:.0f}", shown);
  const int decimals = v < 9.995 ? 2 : v < 99.95 ? 1 : 0;
  return fmt::format("{:.{}f}{}", shown, decimals, suffixes[k]);
}

std::string human_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  if (seconds < 10) return fmt::format("{:.1f}s", seconds);
  const int64_t s = std::llround(seconds);
  if (s < 3600) return s < 60 ? fmt::format("{}s", s) : fmt::format("{}m{:02d}s", s / 60, s % 60);
  return fmt::format("{}h{:02d}m", s / 3600, (s % 3600) / 60);
}

Progress::Progress(std::string label, int64_t total, std::string unit)
    : Progress(std::move(label), total, std::move(unit), stderr, ::isatty(::fileno(stderr)) == 1) {}

Progress::Progress(std::string label, int64_t total, std::string unit, std::FILE* out,
                   bool terminal)
    : label_(std::move(label)),
      unit_(std::move(unit)),
      total_(total),
      out_(out),
      terminal_(terminal),
      start_(Clock::now()),
      last_draw_(start_) {}

Progress::~Progress() {
  if (!finished_ && terminal_ && drawn_) std::fputc('\n', out_);
}

std::string Progress::line(int64_t done, double elapsed_s) const {
  const double rate = elapsed_s > 0 ? done / elapsed_s : 0;
  std::string text = label_;
  if (total_ > 0) {
    text += fmt::format(" {:3.0f}% {}/{}", 100.0 * std::min(done, total_) / total_,
                        human_count(static_cast<double>(done)),
                        with_unit(human_count(static_cast<double>(total_)), unit_));
  } else {
    text += " " + with_unit(human_count(static_cast<double>(done)), unit_);
  }
  text += "  " + with_unit(human_count(rate), unit_) + "/s";
  if (done >= total_ && total_ > 0) {
    text += "  in " + human_duration(elapsed_s);
  } else if (total_ > 0 && rate > 0) {
    text += "  ETA " + human_duration((total_ - done) / rate);
  } else {
    text += "  " + human_duration(elapsed_s);
  }
  return text;
}

void Progress::draw(int64_t done, bool final) {
  const double elapsed = std::chrono::duration<double>(Clock::now() - start_).count();
  const std::string text = line(done, elapsed);
  if (terminal_) {
    // \r and "erase to end of line" redraw in place; the final line ends it.
    std::fprintf(out_, "\r%s\x1b[K%s", text.c_str(), final ? "\n" : "");
  } else {
    std::fprintf(out_, "%s\n", text.c_str());
  }
  std::fflush(out_);
  last_draw_ = Clock::now();
  drawn_ = true;
  drawn_done_ = done;
}

void Progress::update(int64_t done) {
  if (finished_) return;
  done_ = done;
  const double since = std::chrono::duration<double>(Clock::now() - last_draw_).count();
  if (since >= (terminal_ ? kTerminalInterval_s : kLogInterval_s)) draw(done, false);
}

void Progress::finish() {
  if (finished_) return;
  finished_ = true;
  // A log already has the line for this point; a terminal line still needs its newline.
  if (!terminal_ && drawn_done_ == done_) return;
  draw(done_, true);
}

}  // namespace quiver

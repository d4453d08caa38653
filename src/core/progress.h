// A progress line on stderr for long jobs (prepare, training):
//   "prepare  42% 1.23G/2.93G B  18.4MB/s  ETA 1m32s"
// On a terminal one line redrawn in place at most ~10 times a second; otherwise (a log
// file, CI) plain lines, at most one every few seconds, so logs stay short.
#pragma once
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace quiver {

class Progress {
 public:
  // total <= 0: unknown, shown without percentage and ETA. unit: "B" for bytes (shown as
  // 12.3MB), or a word such as "tok" (shown as 12.3M tok).
  Progress(std::string label, int64_t total, std::string unit);
  // For tests: writes to `out`, treated as a terminal or not as `terminal` says.
  Progress(std::string label, int64_t total, std::string unit, std::FILE* out, bool terminal);
  ~Progress();  // ends an unfinished terminal line, so that later output starts clean
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void update(int64_t done);  // done so far (absolute, not an increment)
  void finish();              // the final line; later calls do nothing

  // The text of the line for `done` after `elapsed_s` seconds.
  std::string line(int64_t done, double elapsed_s) const;

 private:
  using Clock = std::chrono::steady_clock;
  void draw(int64_t done, bool final);

  std::string label_, unit_;
  int64_t total_;
  std::FILE* out_;
  bool terminal_;
  bool finished_ = false;
  int64_t done_ = 0;
  Clock::time_point start_, last_draw_;
  bool drawn_ = false;
  int64_t drawn_done_ = -1;  // `done` of the last line drawn
};

// 1234 → "1.23K", 5.6e6 → "5.60M", 999 → "999" (K, M, G, T: powers of 1000).
std::string human_count(double value);
// 75 → "1m15s", 3725 → "1h02m", 9.5 → "9.5s".
std::string human_duration(double seconds);

}  // namespace quiver

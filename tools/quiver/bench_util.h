// Shared pieces of `quiver bench`: robust timing, the machine's description, and result
// files (JSON rows with date, machine and command) under bench/results/.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "train/plot.h"

namespace quiver::cli {

struct Timing {
  double median_s = 0;
  double min_s = 0;
  int reps = 0;
};

// Runs fn `warmup` times, then `reps` times, and returns the median and minimum.
Timing time_it(const std::function<void()>& fn, int warmup, int reps);

std::string cpu_description();  // "AMD EPYC ... (2 threads)"
std::string utc_date();         // "2026-11-29"
std::string command_line(int argc, char** argv);
void set_command_line(const std::string& cmd);  // recorded by main()
const std::string& recorded_command_line();

// Writes {"benchmark", "date", "machine", "command", "rows"} to DIR/NAME-DATE.json and
// a Markdown table of the rows to DIR/NAME-DATE.md: a column per key, in the order first seen
// over the rows, empty in the rows without it.
// Returns the JSON path.
std::string write_results(const std::string& dir, const std::string& name,
                          const std::string& machine, const nlohmann::ordered_json& rows);

// Prints rows as an aligned text table to stdout (the same columns).
void print_table(const nlohmann::ordered_json& rows);

// A peer's results beside ours: for each of `rows`, the first of `peer` (an array of objects)
// whose `keys` all equal the row's; copies that peer row's `columns` (those it has) into the
// row. Returns how many rows found a peer row.
int join_rows(nlohmann::ordered_json& rows, const nlohmann::ordered_json& peer, const std::vector<std::string>& keys,
              const std::vector<std::string>& columns);

// Plot series of benchmark rows: one line with markers per distinct value of the string column
// `group` (first-seen order) through the rows' (x, y) sorted by x; rows without a finite
// number in x or y are left out.
std::vector<train::PlotSeries> row_series(const nlohmann::ordered_json& rows, const std::string& group,
                                          const std::string& x, const std::string& y);

// Writes the plot beside a results file (write_results' JSON path, .json → .svg), atomically;
// returns its path.
std::string write_plot(const std::string& json_path, const std::vector<train::PlotSeries>& series,
                       const train::PlotOptions& options);

}  // namespace quiver::cli

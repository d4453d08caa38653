// Bench result files: rows that do not share their keys still make one well-formed table.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "bench_util.h"
#include "testing.h"

namespace qt = quiver::testing;

TEST(BenchResults, RowsWithDifferentKeysShareOneTable) {
  qt::ScratchDir dir("bench_results_columns");
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  rows.push_back({{"benchmark", "generate"}, {"tokens_per_s", 1656.4}});
  rows.push_back({{"benchmark", "train"}, {"tokens_per_s", 239136.3}, {"device_mib", 816.0}});
  const std::string json = quiver::cli::write_results(dir.path().string(), "unit", "test machine", rows);
  std::ifstream md(json.substr(0, json.size() - 5) + ".md");
  ASSERT_TRUE(md.good());
  std::vector<std::string> table;
  for (std::string line; std::getline(md, line);)
    if (!line.empty() && line[0] == '|') table.push_back(line);
  ASSERT_EQ(table.size(), 4u);  // header, rule, two rows
  EXPECT_EQ(table[0], "| benchmark | tokens_per_s | device_mib |");
  for (const std::string& line : table) EXPECT_EQ(std::count(line.begin(), line.end(), '|'), 4) << line;
  EXPECT_EQ(table[2], "| generate | 1656.4 |  |");  // the missing cell is empty, not another row's
  EXPECT_EQ(table[3], "| train | 239136.3 | 816 |");
}

// Plot series from rows: one line per group through its points sorted by x, rows without
// numbers left out; the plot lands beside the results file.
TEST(BenchResults, RowSeriesGroupAndSort) {
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  rows.push_back({{"model", "a"}, {"paper", 8.33}, {"speedup", 4.8}});
  rows.push_back({{"model", "b"}, {"paper", 3.04}, {"speedup", 2.1}});
  rows.push_back({{"model", "a"}, {"paper", 5.06}, {"speedup", 3.3}});
  rows.push_back({{"model", "a"}, {"paper", nullptr}, {"speedup", 9.0}});  // no paper value: left out
  rows.push_back({{"model", "b"}, {"paper", 1.5}, {"speedup", "fast"}});   // not a number: left out
  const auto series = quiver::cli::row_series(rows, "model", "paper", "speedup");
  ASSERT_EQ(series.size(), 2u);
  EXPECT_EQ(series[0].label, "a");
  EXPECT_EQ(series[0].x, (std::vector<double>{5.06, 8.33}));
  EXPECT_EQ(series[0].y, (std::vector<double>{3.3, 4.8}));
  EXPECT_TRUE(series[0].markers);
  EXPECT_EQ(series[1].label, "b");
  EXPECT_EQ(series[1].x, (std::vector<double>{3.04}));

  qt::ScratchDir dir("bench_results_plot");
  const std::string json = quiver::cli::write_results(dir.path().string(), "unit", "test machine", rows);
  const std::string svg = quiver::cli::write_plot(json, series, {});
  EXPECT_EQ(svg, json.substr(0, json.size() - 5) + ".svg");
  std::ifstream f(svg);
  std::stringstream text;
  text << f.rdbuf();
  EXPECT_NE(text.str().find("data-label=\"a\""), std::string::npos);
  EXPECT_THROW(quiver::cli::write_plot(dir.path().string() + "/x.md", series, {}), quiver::Error);
}

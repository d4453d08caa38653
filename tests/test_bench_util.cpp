// Bench result files: rows that do not share their keys still make one well-formed table.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "bench_util.h"
#include "quiver/error.h"
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

TEST(BenchResults, PeerRowsJoinOnTheirKeys) {
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  rows.push_back({{"B", 64}, {"T", 1024}, {"mixer", "flash_relation"}, {"total_ms", 1.5}});
  rows.push_back({{"B", 32}, {"T", 2048}, {"mixer", "attention"}, {"total_ms", 2.4}});
  rows.push_back({{"B", 8}, {"T", 4096}, {"mixer", "attention"}, {"total_ms", 3.1}});
  const nlohmann::ordered_json peer = nlohmann::ordered_json::parse(R"([
    {"B": 32, "T": 2048, "sdpa_total_ms": 2.3, "extra": 1},
    {"B": 64, "T": 1024, "sdpa_total_ms": 1.6, "materialized_total_ms": 29.5},
    {"B": 64, "T": 4096, "sdpa_total_ms": 9.0}])");
  EXPECT_EQ(quiver::cli::join_rows(rows, peer, {"B", "T"}, {"sdpa_total_ms", "materialized_total_ms"}), 2);
  EXPECT_DOUBLE_EQ(rows[0]["sdpa_total_ms"].get<double>(), 1.6);
  EXPECT_DOUBLE_EQ(rows[0]["materialized_total_ms"].get<double>(), 29.5);
  EXPECT_DOUBLE_EQ(rows[1]["sdpa_total_ms"].get<double>(), 2.3);
  EXPECT_FALSE(rows[1].contains("materialized_total_ms"));  // the peer row has none
  EXPECT_FALSE(rows[1].contains("extra"));                  // not asked for
  EXPECT_FALSE(rows[2].contains("sdpa_total_ms"));          // (8, 4096): no peer row; B alone must not match
  EXPECT_THROW(quiver::cli::join_rows(rows, nlohmann::ordered_json::object(), {"B"}, {"x"}), quiver::Error);
}

TEST(BenchRelationCli, BadShapeAndModeListsFailNamingTheEntry) {
  qt::ScratchDir dir("bench_relation_shapes");
  for (const char* bad : {"64:1024:8", "64:1024:8:0", "64x1024x8x48", "1:2:3:4:5", ",64:1024:8:48"}) {
    const qt::CliResult r =
        qt::run_cli(fmt::format("bench relation --device cuda --peer none --shapes '{}'", bad), dir);
    EXPECT_NE(r.status, 0) << bad;
    EXPECT_NE(r.err.find("--shapes"), std::string::npos) << bad << ": " << r.err;
  }
  for (const char* bad : {"two-pass,fast", ""}) {
    const qt::CliResult r = qt::run_cli(fmt::format("bench relation --device cuda --peer none --dq '{}'", bad), dir);
    EXPECT_NE(r.status, 0) << bad;
    EXPECT_NE(r.err.find("--dq"), std::string::npos) << bad << ": " << r.err;
  }
  const qt::CliResult r = qt::run_cli("bench relation --device tpu", dir);
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("cpu or cuda"), std::string::npos) << r.err;
}

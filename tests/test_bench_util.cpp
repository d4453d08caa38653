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

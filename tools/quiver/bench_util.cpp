#include "bench_util.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "quiver/error.h"
#include "train/checkpoint.h"

namespace quiver::cli {

Timing time_it(const std::function<void()>& fn, int warmup, int reps) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> t;
  t.reserve(reps);
  for (int i = 0; i < reps; ++i) {
    auto a = std::chrono::steady_clock::now();
    fn();
    auto b = std::chrono::steady_clock::now();
    t.push_back(std::chrono::duration<double>(b - a).count());
  }
  std::sort(t.begin(), t.end());
  Timing out;
  out.reps = reps;
  out.min_s = t.front();
  out.median_s = reps % 2 ? t[reps / 2] : 0.5 * (t[reps / 2 - 1] + t[reps / 2]);
  return out;
}

std::string cpu_description() {
  std::ifstream f("/proc/cpuinfo");
  std::string line, model = "unknown CPU";
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) == 0) {
      auto pos = line.find(':');
      if (pos != std::string::npos) model = line.substr(pos + 2);
      break;
    }
  }
  return fmt::format("{} ({} hardware threads)", model, std::thread::hardware_concurrency());
}

std::string utc_date() {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", &tm);
  return buf;
}

std::string command_line(int argc, char** argv) {
  std::string s = "quiver";
  for (int i = 1; i < argc; ++i) s += std::string(" ") + argv[i];
  return s;
}

namespace {
std::string& command_storage() {
  static std::string s;
  return s;
}
std::string cell(const nlohmann::ordered_json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number_float()) {
    double d = v.get<double>();
    return std::abs(d) >= 1000 || d == 0 ? fmt::format("{:.1f}", d) : fmt::format("{:.4g}", d);
  }
  return v.dump();
}
// The columns of a table of rows that need not share their keys (a generation row has no
// device memory): every key, in the order first seen.
std::vector<std::string> columns(const nlohmann::ordered_json& rows) {
  std::vector<std::string> keys;
  for (const auto& row : rows)
    for (const auto& [k, v] : row.items())
      if (std::find(keys.begin(), keys.end(), k) == keys.end()) keys.push_back(k);
  return keys;
}
// A row's cell in a column; empty where the row has no such key.
std::string cell(const nlohmann::ordered_json& row, const std::string& key) {
  const auto it = row.find(key);
  return it == row.end() ? std::string() : cell(*it);
}
}  // namespace

void set_command_line(const std::string& cmd) { command_storage() = cmd; }
const std::string& recorded_command_line() { return command_storage(); }

std::string write_results(const std::string& dir, const std::string& name,
                          const std::string& machine, const nlohmann::ordered_json& rows) {
  std::filesystem::create_directories(dir);
  std::string date = utc_date();
  nlohmann::ordered_json doc;
  doc["benchmark"] = name;
  doc["date"] = date;
  doc["machine"] = machine;
  doc["command"] = recorded_command_line();
  doc["rows"] = rows;
  std::string base = fmt::format("{}/{}-{}", dir, name, date);
  {
    std::ofstream f(base + ".json");
    QV_CHECK(f.good(), "cannot write {}.json", base);
    f << doc.dump(2) << "\n";
  }
  std::ofstream md(base + ".md");
  QV_CHECK(md.good(), "cannot write {}.md", base);
  md << "# " << name << "\n\n- date: " << date << "\n- machine: " << machine
     << "\n- command: `" << recorded_command_line() << "`\n\n";
  if (!rows.empty()) {
    const std::vector<std::string> keys = columns(rows);
    std::string header = "|", rule = "|";
    for (const std::string& k : keys) {
      header += " " + k + " |";
      rule += "---|";
    }
    md << header << "\n" << rule << "\n";
    for (const auto& row : rows) {
      md << "|";
      for (const std::string& k : keys) md << " " << cell(row, k) << " |";
      md << "\n";
    }
  }
  return base + ".json";
}

void print_table(const nlohmann::ordered_json& rows) {
  if (rows.empty()) return;
  const std::vector<std::string> keys = columns(rows);
  std::vector<size_t> width(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) width[i] = keys[i].size();
  for (auto& row : rows)
    for (size_t i = 0; i < keys.size(); ++i)
      width[i] = std::max(width[i], cell(row, keys[i]).size());
  std::string line;
  for (size_t i = 0; i < keys.size(); ++i) line += fmt::format("{:>{}}  ", keys[i], width[i]);
  fmt::print("{}\n", line);
  for (auto& row : rows) {
    line.clear();
    for (size_t i = 0; i < keys.size(); ++i) line += fmt::format("{:>{}}  ", cell(row, keys[i]), width[i]);
    fmt::print("{}\n", line);
  }
}

std::vector<train::PlotSeries> row_series(const nlohmann::ordered_json& rows, const std::string& group,
                                          const std::string& x, const std::string& y) {
  auto number = [](const nlohmann::ordered_json& row, const std::string& key, double& out) {
    if (!row.contains(key) || !row[key].is_number()) return false;
    out = row[key].get<double>();
    return std::isfinite(out);
  };
  std::vector<std::string> order;
  std::map<std::string, std::vector<std::pair<double, double>>> points;
  for (const auto& row : rows) {
    double px = 0, py = 0;
    if (!number(row, x, px) || !number(row, y, py)) continue;
    const std::string name = row.contains(group) && row[group].is_string() ? row[group].get<std::string>() : "";
    if (!points.count(name)) order.push_back(name);
    points[name].emplace_back(px, py);
  }
  std::vector<train::PlotSeries> out;
  for (const std::string& name : order) {
    std::vector<std::pair<double, double>>& p = points[name];
    std::stable_sort(p.begin(), p.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    train::PlotSeries s;
    s.label = name;
    s.markers = true;
    for (const auto& [px, py] : p) {
      s.x.push_back(px);
      s.y.push_back(py);
    }
    out.push_back(std::move(s));
  }
  return out;
}

std::string write_plot(const std::string& json_path, const std::vector<train::PlotSeries>& series,
                       const train::PlotOptions& options) {
  QV_CHECK(json_path.size() > 5 && json_path.substr(json_path.size() - 5) == ".json",
           "bench plot: '{}' is not a results file (.json)", json_path);
  const std::string path = json_path.substr(0, json_path.size() - 5) + ".svg";
  train::write_text_atomic(path, train::render_svg(series, options));
  return path;
}

int join_rows(nlohmann::ordered_json& rows, const nlohmann::ordered_json& peer, const std::vector<std::string>& keys,
              const std::vector<std::string>& columns) {
  QV_CHECK(rows.is_array() && peer.is_array(), "join_rows: rows and peer rows must be arrays");
  int matched = 0;
  for (auto& row : rows) {
    for (const auto& p : peer) {
      const bool same = p.is_object() && std::all_of(keys.begin(), keys.end(), [&](const std::string& k) {
        return row.contains(k) && p.contains(k) && row[k] == p[k];
      });
      if (!same) continue;
      for (const std::string& c : columns)
        if (p.contains(c)) row[c] = p[c];
      ++matched;
      break;
    }
  }
  return matched;
}

}  // namespace quiver::cli

// `quiver compare RUN...`: several training runs side by side: a table (config, steps,
// tokens, time, final and best val NLL) and an SVG of val loss against tokens.
#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>

#include <nlohmann/json.hpp>

#include "bench_util.h"
#include "commands.h"
#include "core/progress.h"
#include "quiver/error.h"
#include "train/checkpoint.h"
#include "train/plot.h"
#include "train/trainer.h"

namespace quiver::cli {

namespace {

namespace fs = std::filesystem;

struct CompareArgs {
  std::vector<std::string> runs;
  std::string out = "compare.svg";
  bool json = false;
};

std::string run_label(const std::string& dir) {
  std::string name = fs::path(dir).lexically_normal().filename().string();
  if (name.empty()) name = fs::path(dir).lexically_normal().parent_path().filename().string();
  return name.empty() ? dir : name;
}

void run(const CompareArgs& a) {
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  std::vector<train::PlotSeries> series;
  for (const std::string& dir : a.runs) {
    QV_CHECK(fs::is_directory(dir), "run folder '{}' does not exist", dir);
    const auto metrics = train::read_metrics((fs::path(dir) / "metrics.jsonl").string());
    QV_CHECK(!metrics.empty(), "run folder '{}': metrics.jsonl is empty (has the run taken a step?)", dir);
    std::string config = "?";
    const fs::path run_json = fs::path(dir) / "run.json";
    if (fs::exists(run_json)) {
      std::ifstream in(run_json);
      try {
        const auto j = nlohmann::json::parse(in);
        config = j.at("config").at("name").get<std::string>();
      } catch (const std::exception& e) {
        fail("run folder '{}': run.json is malformed ({})", dir, e.what());
      }
    }
    train::PlotSeries s;
    s.label = run_label(dir) + (config != "?" ? " (" + config + ")" : "");
    s.markers = true;
    double best = NAN, final_val = NAN;
    for (const auto& m : metrics)
      if (m.contains("val_loss") && m["val_loss"].is_number() && m.contains("tokens")) {
        const double v = m["val_loss"].get<double>();
        s.x.push_back(m["tokens"].get<double>());
        s.y.push_back(v);
        final_val = v;
        if (!(best <= v)) best = v;
      }
    const auto& last = metrics.back();
    nlohmann::ordered_json row;
    row["run"] = run_label(dir);
    row["config"] = config;
    row["steps"] = last["step"];
    row["tokens"] = human_count(last.value("tokens", 0.0));
    row["time"] = human_duration(last.value("elapsed_s", NAN));
    row["final_val_nll"] = std::isnan(final_val) ? nlohmann::ordered_json("-") : nlohmann::ordered_json(final_val);
    row["best_val_nll"] = std::isnan(best) ? nlohmann::ordered_json("-") : nlohmann::ordered_json(best);
    rows.push_back(row);
    series.push_back(std::move(s));
  }
  train::PlotOptions options;
  options.title = "validation loss";
  options.x_label = "tokens";
  options.y_label = "val NLL per token (nats)";
  train::write_text_atomic(a.out, train::render_svg(series, options));
  if (a.json) {
    fmt::print("{}\n", rows.dump(2));
  } else {
    print_table(rows);
    fmt::print("plot: {}\n", a.out);
  }
}

}  // namespace

void register_compare(CLI::App& app) {
  auto a = std::make_shared<CompareArgs>();
  CLI::App* cmd = app.add_subcommand(
      "compare", "Compare training runs: a table of final and best val NLL, tokens and time, and an SVG of\n"
                 "val loss against tokens (one line per run).");
  cmd->add_option("runs", a->runs, "run folders written by `quiver train`")->required();
  cmd->add_option("--out", a->out, "SVG to write")->capture_default_str();
  cmd->add_flag("--json", a->json, "print the table as JSON");
  cmd->callback([a] { run(*a); });
}

}  // namespace quiver::cli

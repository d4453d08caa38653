// `quiver algebra LAW`: the support table, the algebra's facts and their numeric
// verification, as text or JSON.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "algebra/law.h"
#include "commands.h"

namespace quiver::cli {

namespace {

struct AlgebraArgs {
  std::string law;
  std::string in_groups, out_groups;
  bool json = false;
};

const char* kind_name(algebra::LawKind kind) {
  switch (kind) {
    case algebra::LawKind::Dense:
      return "dense (matrix algebra)";
    case algebra::LawKind::Graph:
      return "graph law";
    case algebra::LawKind::Tensor:
      return "tensor product";
    case algebra::LawKind::Table:
      return "support table";
  }
  return "?";
}

std::string join(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s.empty() ? "-" : s;
}

algebra::GroupWidths widths_from(const AlgebraArgs& a, int q) {
  algebra::GroupWidths w;
  if (a.in_groups.empty() && a.out_groups.empty()) return algebra::GroupWidths::equal(q, q, q);
  w.in = algebra::parse_widths(a.in_groups.empty() ? a.out_groups : a.in_groups, "--in-groups");
  w.out = algebra::parse_widths(a.out_groups.empty() ? a.in_groups : a.out_groups, "--out-groups");
  w.validate(q);
  return w;
}

void run(const AlgebraArgs& a) {
  algebra::Law law = algebra::Law::parse(a.law);
  algebra::GroupWidths widths = widths_from(a, law.q());
  algebra::Facts f = algebra::facts(law, widths);
  const int q = law.q();
  const int kMaxTable = 64;

  if (a.json) {
    nlohmann::ordered_json j;
    j["law"] = law.name();
    j["kind"] = kind_name(law.kind());
    j["q"] = q;
    j["dim"] = f.dim;
    j["rank"] = f.rank ? nlohmann::ordered_json(*f.rank) : nlohmann::ordered_json(nullptr);
    j["rank_lower_bound"] = f.rank_lower_bound ? nlohmann::ordered_json(*f.rank_lower_bound)
                                               : nlohmann::ordered_json(nullptr);
    j["maximal_ideals"] = f.maximal_ideals ? nlohmann::ordered_json(*f.maximal_ideals)
                                           : nlohmann::ordered_json(nullptr);
    j["products"] = f.products;
    j["rho"] = f.rho;
    j["ideal_speedup"] = 1.0 / f.rho;
    j["in_groups"] = widths.in;
    j["out_groups"] = widths.out;
    j["type_cost"] = f.type_cost;
    j["associative"] = f.associative;
    j["unital"] = f.unital;
    j["associativity_error"] = f.associativity_error;
    j["unit_error"] = f.unit_error;
    if (q <= kMaxTable) {
      nlohmann::ordered_json table = nlohmann::ordered_json::array();
      for (int al = 0; al < q; ++al) {
        nlohmann::ordered_json row = nlohmann::ordered_json::array();
        for (int d = 0; d < q; ++d) row.push_back(law.support(al, d));
        table.push_back(row);
      }
      j["support"] = table;
    }
    fmt::print("{}\n", j.dump(2));
    return;
  }

  fmt::print("law {}: {}, q = {} groups\n", law.name(), kind_name(law.kind()), q);
  fmt::print("input widths  {}\noutput widths {}\n\n", fmt::join(widths.in, ","),
             fmt::join(widths.out, ","));
  if (q <= kMaxTable) {
    fmt::print("support B(row type, output group): the input groups whose blocks contribute\n");
    std::vector<std::vector<std::string>> cells(q, std::vector<std::string>(q));
    size_t width = 3;
    for (int al = 0; al < q; ++al)
      for (int d = 0; d < q; ++d)
        width = std::max(width, (cells[al][d] = join(law.support(al, d))).size());
    std::string head = fmt::format("{:>6}", "");
    for (int d = 0; d < q; ++d) head += fmt::format(" {:>{}}", fmt::format("d{}", d), width);
    fmt::print("{}\n", head);
    for (int al = 0; al < q; ++al) {
      std::string line = fmt::format("{:>6}", fmt::format("a{}", al));
      for (int d = 0; d < q; ++d) line += fmt::format(" {:>{}}", cells[al][d], width);
      fmt::print("{}\n", line);
    }
  } else {
    fmt::print("support table omitted for q > {} (the JSON output omits it too)\n", kMaxTable);
  }
  fmt::print("\nfacts\n");
  fmt::print("  dimension              {}\n", f.dim);
  fmt::print("  bilinear rank          {}\n",
             f.rank ? fmt::format("{} (exact)", *f.rank) : "unknown");
  if (f.rank_lower_bound)
    fmt::print("  Alder–Strassen bound   {} = 2·{} − {} maximal two-sided ideals\n",
               *f.rank_lower_bound, f.dim, *f.maximal_ideals);
  else
    fmt::print("  Alder–Strassen bound   unknown (maximal ideals not known for a raw table)\n");
  fmt::print("  explicit products      {}\n", f.products);
  fmt::print("  arithmetic fraction ρ  {:.6f} (ideal speedup over dense {:.3f}×)\n", f.rho,
             1.0 / f.rho);
  std::string costs;
  for (int al = 0; al < q && al < 16; ++al)
    costs += fmt::format("{}{:.0f}", al ? ", " : "", f.type_cost[al]);
  fmt::print("  MACs per row by type   {}{}\n", costs, q > 16 ? ", ..." : "");
  fmt::print("\nverification (random elements, structure constants)\n");
  fmt::print("  associative            {} (max relative error {:.2e})\n",
             f.associative ? "yes" : "NO", f.associativity_error);
  fmt::print("  unital                 {} (max relative error {:.2e})\n", f.unital ? "yes" : "NO",
             f.unit_error);
}

}  // namespace

void register_algebra(CLI::App& app) {
  auto args = std::make_shared<AlgebraArgs>();
  CLI::App* cmd = app.add_subcommand(
      "algebra",
      "Print a law's support table, its algebra's facts (dimension, bilinear rank, Alder–Strassen\n"
      "bound, explicit product count, arithmetic fraction ρ) and a numeric check of associativity\n"
      "and the unit.\n"
      "LAW: dense | dense:Q | Qq (e.g. Q4) | blockdiag:Q | graph:Q:a>b,c>d (directed edges) |\n"
      "factors joined by x for tensor products (e.g. Q2xQ2, Q2xQ2xQ2, graph:3:0>1xQ2).");
  cmd->add_option("law", args->law, "the law")->required();
  cmd->add_option("--in-groups", args->in_groups, "input group widths a,b,... (default: equal)");
  cmd->add_option("--out-groups", args->out_groups,
                  "output group widths a,b,... (default: the input widths)");
  cmd->add_flag("--json", args->json, "print JSON");
  cmd->callback([args] { run(*args); });
}

}  // namespace quiver::cli

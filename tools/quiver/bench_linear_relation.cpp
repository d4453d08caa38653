// `quiver bench linear_relation`: the recurrent Linear Relation against the chunked form on
// the CPU, forward and forward+backward in F32 at the hybrid 30M head shape (H = 8, Dh = 60).
// Every timed pair is also checked against each other (max relative error over outputs).
#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "bench_util.h"
#include "commands.h"
#include "ops/linear_relation.h"
#include "quiver/parallel.h"
#include "quiver/rng.h"

namespace quiver::cli {
namespace {

struct LinearRelationBenchOptions {
  std::string device = "cpu";
  std::string results_dir = "bench/results";
  int64_t chunk = ops::kLinearRelationDefaultChunk;
};

struct Problem {
  Tensor p1, p2, v, g, dy;
  Tensor y, dp1, dp2, dv, dg;
};

Problem make_problem(int64_t T, int64_t H, int64_t Dh, Rng& rng) {
  Shape shape{1, T, H, Dh};
  auto make = [&](double lo, double hi) {
    Tensor t = Tensor::empty(shape, DType::F32);
    rng.fill_uniform(t, lo, hi);
    return t;
  };
  Problem p;
  p.p1 = make(-1, 1);
  p.p2 = make(-1, 1);
  p.v = make(-1, 1);
  p.g = make(-1, 0);  // α in (e^-1, 1]: the range a trained retention gate mostly uses
  p.dy = make(-1, 1);
  for (Tensor* t : {&p.y, &p.dp1, &p.dp2, &p.dv, &p.dg}) *t = Tensor::empty(shape, DType::F32);
  return p;
}

struct Outputs {
  Tensor y, dp1, dp2, dv, dg;
};

Outputs snapshot(const Problem& p) {
  return {p.y.clone(), p.dp1.clone(), p.dp2.clone(), p.dv.clone(), p.dg.clone()};
}

void run_bench(const LinearRelationBenchOptions& o) {
  QV_CHECK(o.device == "cpu", "bench linear_relation: only --device cpu is implemented, got '{}'",
           o.device);
  const int64_t H = 8, Dh = 60;
  Rng rng(20260101);
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  for (int64_t T : {1024, 4096, 16384}) {
    Problem p = make_problem(T, H, Dh, rng);
    const int reps = T <= 1024 ? 15 : T <= 4096 ? 9 : 5;
    auto rec_fwd = [&] { ops::linear_relation_recurrent_forward(p.p1, p.p2, p.v, p.g, p.y); };
    auto chk_fwd = [&] {
      ops::linear_relation_chunked_forward(p.p1, p.p2, p.v, p.g, p.y, o.chunk);
    };
    auto rec_bwd = [&] {
      ops::linear_relation_recurrent_backward(p.p1, p.p2, p.v, p.g, p.dy, p.dp1, p.dp2, p.dv, p.dg);
    };
    auto chk_bwd = [&] {
      ops::linear_relation_chunked_backward(p.p1, p.p2, p.v, p.g, p.dy, p.dp1, p.dp2, p.dv, p.dg,
                                            o.chunk);
    };
    auto rec_both = [&] {
      rec_fwd();
      rec_bwd();
    };
    auto chk_both = [&] {
      chk_fwd();
      chk_bwd();
    };
    Timing rf = time_it(rec_fwd, 1, reps);
    Timing rfb = time_it(rec_both, 1, reps);
    Outputs rec = snapshot(p);
    Timing cf = time_it(chk_fwd, 1, reps);
    Timing cfb = time_it(chk_both, 1, reps);
    double fwd_err = rel_error(p.y, rec.y);
    double bwd_err = std::max({fwd_err, rel_error(p.dp1, rec.dp1), rel_error(p.dp2, rec.dp2),
                               rel_error(p.dv, rec.dv), rel_error(p.dg, rec.dg)});
    auto row = [&](const char* pass, const Timing& r, const Timing& c, double err) {
      nlohmann::ordered_json j;
      j["T"] = T;
      j["H"] = H;
      j["Dh"] = Dh;
      j["chunk"] = o.chunk;
      j["pass"] = pass;
      j["recurrent_ms"] = r.median_s * 1e3;
      j["chunked_ms"] = c.median_s * 1e3;
      j["recurrent_tok_s"] = static_cast<double>(T) / r.median_s;
      j["chunked_tok_s"] = static_cast<double>(T) / c.median_s;
      j["chunked_speedup"] = r.median_s / c.median_s;
      j["rel_err"] = err;
      j["reps"] = reps;
      return j;
    };
    rows.push_back(row("forward", rf, cf, fwd_err));
    rows.push_back(row("forward+backward", rfb, cfb, bwd_err));
  }
  print_table(rows);
  std::string machine = fmt::format("{}, {} quiver threads", cpu_description(), num_threads());
  std::string path = write_results(o.results_dir, "linear_relation-cpu", machine, rows);
  fmt::print("wrote {}\n", path);
}

}  // namespace

void register_bench_linear_relation(CLI::App& bench) {
  auto o = std::make_shared<LinearRelationBenchOptions>();
  CLI::App* cmd = bench.add_subcommand(
      "linear_relation",
      "Linear Relation: recurrent vs chunked, forward and forward+backward, F32, B = 1, H = 8,\n"
      "Dh = 60, T = 1024, 4096, 16384; tokens per second and the chunked/recurrent speedup");
  cmd->add_option("--device", o->device, "cpu (the only backend so far)")->capture_default_str();
  cmd->add_option("--results-dir", o->results_dir, "where the JSON and Markdown results go")
      ->capture_default_str();
  cmd->add_option("--chunk", o->chunk, "chunk length of the chunked form")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->callback([o] { run_bench(*o); });
}

}  // namespace quiver::cli

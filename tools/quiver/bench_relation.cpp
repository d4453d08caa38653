// `quiver bench relation`:
//   --device cpu: the materialized Relation reference against FlashRelation on the CPU, forward
//     and forward+backward in F32 (B = 1, H = 8, Dh = 64: the 30M preset's heads), with flash
//     attention at the same shape for comparison. Each row records the working arrays the call
//     allocates (the reference O(T²) per concurrent head, flash O(T)), and every flash result
//     is checked against the reference.
//   --device cuda: FlashRelation and quiver's flash attention, forward + backward, at the
//     Relation paper's op-level scales (cuda/relation_bench.h: the backward modes of --dq, alternating
//     trials, every variant checked on one head against float64), and in the same run the
//     PyTorch peers of bench/peer_attention.py (SDPA with the FlashAttention backend, the
//     materialized Relation) when python3 with a CUDA torch is there: the ratios to them.
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "bench_util.h"
#include "commands.h"
#include "ops/attention.h"
#include "ops/relation.h"
#include "quiver/parallel.h"
#include "quiver/rng.h"
#include "cuda/relation_bench.h"  // plain C++ (the shapes and options); the bench itself needs CUDA
#ifdef QUIVER_HAVE_CUDA
#include "cuda/backend.h"
#endif

namespace quiver::cli {
namespace {

struct RelationBenchArgs {
  std::string device = "cpu";
  std::string results_dir = "bench/results";
  std::string seq = "1024,4096";
  int64_t heads = 8, head_dim = 64, tile = 64;
  // Heads the reference runs on at T >= 4096 (its time per head does not depend on the head
  // count once every thread has a head; its memory is per concurrent head).
  int64_t reference_heads_at_4096 = 8;
  // cuda: B:T:H:Dh,... (empty: the paper's 10M, 30M and 100M scales), trials, and the peer
  // script ("" or "none": no peer).
  std::string shapes;
  std::string dq = "two-pass,one-pass";
  int runs = 11;
  std::string peer = "bench/peer_attention.py";
  int peer_trials = 20;
};

std::vector<int64_t> parse_list(const std::string& s) {
  std::vector<int64_t> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    QV_CHECK(!item.empty(), "--seq: empty entry in '{}'", s);
    out.push_back(std::stoll(item));
    QV_CHECK(out.back() >= 1, "--seq: lengths must be positive, got {}", out.back());
  }
  return out;
}

struct Problem {
  Tensor p1, p2, v, dy;
};

Problem make_problem(int64_t T, int64_t H, int64_t Dh, Rng& rng) {
  const Shape shape{1, T, H, Dh};
  auto make = [&](double stddev) {
    Tensor t = Tensor::empty(shape, DType::F32);
    rng.fill_normal(t, 0.0, stddev);
    return t;
  };
  return {make(1.0), make(1.0), make(1.0), make(1.0)};
}

// The first `h` heads of a [1, T, H, Dh] tensor, contiguous.
Tensor first_heads(const Tensor& t, int64_t h) { return t.slice(2, 0, h).clone(); }

std::vector<cuda::RelationBenchShape> parse_shapes(const std::string& text) {
  if (text.empty()) return cuda::relation_bench_paper_shapes();
  std::vector<cuda::RelationBenchShape> shapes;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    cuda::RelationBenchShape s;
    s.scale = item;
    char c1 = 0, c2 = 0, c3 = 0;
    std::istringstream in(item);
    std::string rest;
    const bool ok = static_cast<bool>(in >> s.B >> c1 >> s.T >> c2 >> s.H >> c3 >> s.Dh) && !(in >> rest) &&
                    c1 == ':' && c2 == ':' && c3 == ':' && s.B > 0 && s.T > 0 && s.H > 0 && s.Dh > 0;
    QV_CHECK(ok, "--shapes: '{}' is not B:T:H:Dh with positive integers", item);
    shapes.push_back(s);
  }
  QV_CHECK(!shapes.empty(), "--shapes: no shape in '{}'", text);
  return shapes;
}

#ifdef QUIVER_HAVE_CUDA
// The peer (bench/peer_attention.py) at our shapes, in this run: its rows, or an empty array
// (with the reason printed) when it cannot run here.
nlohmann::ordered_json run_peer(const RelationBenchArgs& a, const std::vector<cuda::RelationBenchShape>& shapes) {
  const nlohmann::ordered_json none = nlohmann::ordered_json::array();
  if (a.peer.empty() || a.peer == "none") return none;
  if (!std::filesystem::exists(a.peer)) {
    fmt::print("peer: {} not found (run from the repository root, or pass --peer PATH); no peer columns\n", a.peer);
    return none;
  }
  if (std::system("python3 -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' "
                  "> /dev/null 2>&1") != 0) {
    fmt::print("peer: python3 with a CUDA build of torch is not available; no peer columns\n");
    return none;
  }
  std::string list;
  for (const auto& s : shapes) list += fmt::format("{}{}:{}:{}:{}", list.empty() ? "" : ",", s.B, s.T, s.H, s.Dh);
  std::filesystem::create_directories(a.results_dir);
  const std::filesystem::path out = std::filesystem::path(a.results_dir) / ".peer-relation.json.tmp";
  std::filesystem::remove(out);
  const std::string cmd = fmt::format("python3 '{}' --trials {} --relation --shapes {} --json '{}'", a.peer,
                                      a.peer_trials, list, out.string());
  fmt::print("peer: {}\n", cmd);
  std::fflush(stdout);
  const int status = std::system(cmd.c_str());
  std::ifstream in(out);
  if (status != 0 || !in) {
    fmt::print("peer: failed (status {}); no peer columns\n", status);
    return none;
  }
  nlohmann::ordered_json peer;
  try {
    peer = nlohmann::ordered_json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    fmt::print("peer: unreadable output {} ({}); no peer columns\n", out.string(), e.what());
    return none;
  }
  std::filesystem::remove(out);
  if (!peer.contains("rows") || !peer["rows"].is_array()) {
    fmt::print("peer: output without rows; no peer columns\n");
    return none;
  }
  fmt::print("peer: torch {}, {}\n", peer.value("torch", std::string("?")), peer.value("device", std::string("?")));
  return peer["rows"];
}
#endif

// FlashRelation and our attention on the GPU (cuda/relation_bench.h) with the PyTorch peers.
void run_cuda(const RelationBenchArgs& a) {
  cuda::RelationBenchOptions options;
  options.shapes = parse_shapes(a.shapes);  // before anything runs: a bad list fails at once
  options.dq.clear();
  std::stringstream modes(a.dq);
  const auto known = cuda::relation_bench_dq_modes();
  for (std::string m; std::getline(modes, m, ',');) {
    QV_CHECK(std::find(known.begin(), known.end(), m) != known.end(), "--dq: no mode '{}' ({})", m,
             fmt::join(known, ", "));
    options.dq.push_back(m);
  }
  QV_CHECK(!options.dq.empty(), "--dq: no mode in '{}'", a.dq);
  options.runs = a.runs;
#ifdef QUIVER_HAVE_CUDA
  QV_CHECK(cuda::device_count() > 0, "bench relation --device cuda: no CUDA device found");
  cuda::register_backend();
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  for (const cuda::RelationBenchRow& r : cuda::bench_relation_cuda(options)) {
    nlohmann::ordered_json row;
    row["scale"] = r.scale;
    row["B"] = r.B;
    row["T"] = r.T;
    row["H"] = r.H;
    row["Dh"] = r.Dh;
    row["mixer"] = r.mixer;
    row["dq"] = r.dq;
    row["forward_ms"] = r.forward_ms;
    row["backward_ms"] = r.backward_ms;
    row["total_ms"] = r.total_ms;
    row["tok_s"] = r.tok_s;
    row["rel_error"] = r.rel_error;
    row["correct"] = r.correct;
    rows.push_back(row);
  }
  const nlohmann::ordered_json peer = run_peer(a, options.shapes);
  join_rows(rows, peer, {"B", "T", "H", "Dh"}, {"sdpa_backend", "sdpa_total_ms", "materialized_total_ms"});
  for (auto& row : rows) {  // throughput ratios: > 1 is faster than the peer
    const double ours = row["total_ms"].get<double>();
    if (row.contains("sdpa_total_ms")) row["vs_sdpa"] = row["sdpa_total_ms"].get<double>() / ours;
    if (row["mixer"] == "flash_relation" && row.contains("materialized_total_ms"))
      row["vs_materialized"] = row["materialized_total_ms"].get<double>() / ours;
    else
      row.erase("materialized_total_ms");
  }
  const std::string machine = fmt::format("{} (GPU), host {}", cuda::device_name(), cpu_description());
  print_table(rows);
  const std::string path = write_results(a.results_dir, "relation-cuda", machine, rows);
  // Forward + backward tok/s against T: each variant, and SDPA where the peer ran.
  nlohmann::ordered_json series_rows = nlohmann::ordered_json::array();
  for (const auto& r : rows) {
    series_rows.push_back({{"series", fmt::format("{} ({})", r["mixer"].get<std::string>(), r["dq"].get<std::string>())},
                           {"T", r["T"]},
                           {"tok_s", r["tok_s"]}});
    if (r["mixer"] == "flash_relation" && r["dq"] == "two-pass" && r.contains("sdpa_total_ms"))
      series_rows.push_back({{"series", "PyTorch SDPA (FlashAttention)"},
                             {"T", r["T"]},
                             {"tok_s", static_cast<double>(r["B"].get<int64_t>() * r["T"].get<int64_t>()) /
                                           (r["sdpa_total_ms"].get<double>() * 1e-3)}});
  }
  train::PlotOptions plot;
  plot.title = fmt::format("Forward + backward on {}: FlashRelation, our attention and SDPA", cuda::device_name());
  plot.x_label = "T (the scales' B·T tokens per call)";
  plot.y_label = "tokens per second";
  const std::string svg = write_plot(path, row_series(series_rows, "series", "T", "tok_s"), plot);
  fmt::print("machine: {}\nresults: {}\nplot: {}\n", machine, path, svg);
  fmt::print("goals (Relation paper scales): flash_relation vs_sdpa >= 0.95 and vs_materialized >= 10\n");
  for (const auto& r : rows)
    QV_CHECK(r["correct"].get<bool>(), "bench relation: {} {} ({} dQ) failed its correctness check (error {})",
             r["scale"].get<std::string>(), r["mixer"].get<std::string>(), r["dq"].get<std::string>(),
             r["rel_error"].get<double>());
#else
  fail("bench relation --device cuda: this build has no CUDA backend");
#endif
}

void run_bench(const RelationBenchArgs& a) {
  if (a.device == "cuda") return run_cuda(a);
  QV_CHECK(a.device == "cpu", "bench relation: --device must be cpu or cuda, got '{}'", a.device);
  const int64_t H = a.heads, Dh = a.head_dim;
  const double lambda = 0.5;
  ops::RelationOptions opt;
  opt.tile = a.tile;
  Rng rng(20261129);
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  for (int64_t T : parse_list(a.seq)) {
    Problem p = make_problem(T, H, Dh, rng);
    const int reps = T <= 1024 ? 5 : 3;
    const int64_t H_ref = T >= 4096 ? std::min(H, a.reference_heads_at_4096) : H;
    const std::string ref_note =
        H_ref < H ? fmt::format("reference on {} of {} heads (time and memory for {} heads; "
                                "speedup scaled per head)",
                                H_ref, H, H_ref)
                  : "";
    Problem r{first_heads(p.p1, H_ref), first_heads(p.p2, H_ref), first_heads(p.v, H_ref),
              first_heads(p.dy, H_ref)};

    Tensor y_ref, dp1_ref, dp2_ref, dv_ref;
    double dl_ref = 0;
    auto ref_fwd = [&] { ops::relation_reference_forward(r.p1, r.p2, r.v, lambda, y_ref, opt); };
    auto ref_fb = [&] {
      ref_fwd();
      dl_ref = ops::relation_reference_backward(r.p1, r.p2, r.v, lambda, r.dy, dp1_ref, dp2_ref,
                                                dv_ref, opt);
    };
    Tensor y, stats, dp1, dp2, dv;
    double dl = 0;
    auto flash_fwd = [&] { ops::flash_relation_forward(p.p1, p.p2, p.v, lambda, y, stats, opt); };
    auto flash_fb = [&] {
      flash_fwd();
      dl = ops::flash_relation_backward(p.p1, p.p2, p.v, lambda, y, stats, p.dy, dp1, dp2, dv, opt);
    };
    Tensor ya, lse, dqa, dka, dva;
    auto attn_fwd = [&] { ops::attention_forward(p.p1, p.p2, p.v, ya, lse, a.tile); };
    auto attn_fb = [&] {
      attn_fwd();
      ops::attention_backward(p.p1, p.p2, p.v, ya, lse, p.dy, dqa, dka, dva, a.tile);
    };

    const Timing t_ref_f = time_it(ref_fwd, 1, reps);
    const Timing t_ref_fb = time_it(ref_fb, 1, reps);
    const Timing t_fl_f = time_it(flash_fwd, 1, reps);
    const Timing t_fl_fb = time_it(flash_fb, 1, reps);
    const Timing t_at_f = time_it(attn_fwd, 1, reps);
    const Timing t_at_fb = time_it(attn_fb, 1, reps);

    // Flash against the reference on the heads the reference ran.
    const double err_fwd = rel_error(first_heads(y, H_ref), y_ref);
    const double err_fb =
        std::max({err_fwd, rel_error(first_heads(dp1, H_ref), dp1_ref),
                  rel_error(first_heads(dp2, H_ref), dp2_ref),
                  rel_error(first_heads(dv, H_ref), dv_ref)});
    const double ref_scale = double(H) / double(H_ref);  // reference time per H heads

    const Shape full{1, T, H, Dh}, ref_shape{1, T, H_ref, Dh};
    const int64_t ws_ref_f = ops::relation_reference_workspace_bytes(ref_shape, DType::F32, false);
    const int64_t ws_ref_fb = std::max(
        ws_ref_f, ops::relation_reference_workspace_bytes(ref_shape, DType::F32, true));
    const int64_t ws_fl_f = ops::flash_relation_workspace_bytes(full, DType::F32, false, a.tile);
    const int64_t ws_fl_fb =
        std::max(ws_fl_f, ops::flash_relation_workspace_bytes(full, DType::F32, true, a.tile));
    const int64_t ws_at_f = ops::attention_forward_workspace_bytes(full, DType::F32, a.tile);

    auto row = [&](const char* impl, const char* pass, int64_t heads, const Timing& t,
                   int64_t workspace, const nlohmann::ordered_json& err,
                   const nlohmann::ordered_json& vs_ref, const nlohmann::ordered_json& vs_attn,
                   const std::string& note) {
      nlohmann::ordered_json j;
      j["T"] = T;
      j["H"] = heads;
      j["Dh"] = Dh;
      j["impl"] = impl;
      j["pass"] = pass;
      j["median_ms"] = t.median_s * 1e3;
      j["min_ms"] = t.min_s * 1e3;
      j["tok_s"] = double(T) / t.median_s;
      j["workspace_MiB"] = double(workspace) / (1 << 20);
      j["rel_err_vs_reference"] = err;
      j["speedup_vs_reference"] = vs_ref;
      j["throughput_vs_attention"] = vs_attn;
      j["reps"] = t.reps;
      j["note"] = note;
      return j;
    };
    const nlohmann::ordered_json none = "-";
    rows.push_back(row("relation-reference", "forward", H_ref, t_ref_f, ws_ref_f, none, none, none,
                       ref_note));
    rows.push_back(row("flash-relation", "forward", H, t_fl_f, ws_fl_f, err_fwd,
                       t_ref_f.median_s * ref_scale / t_fl_f.median_s,
                       t_at_f.median_s / t_fl_f.median_s, ""));
    rows.push_back(row("flash-attention", "forward", H, t_at_f, ws_at_f, none, none, none,
                       "causal MHA, same q/k/v shapes"));
    rows.push_back(row("relation-reference", "forward+backward", H_ref, t_ref_fb, ws_ref_fb, none,
                       none, none, ref_note));
    rows.push_back(row("flash-relation", "forward+backward", H, t_fl_fb, ws_fl_fb, err_fb,
                       t_ref_fb.median_s * ref_scale / t_fl_fb.median_s,
                       t_at_fb.median_s / t_fl_fb.median_s,
                       H_ref == H ? fmt::format("dlambda {:.6g} (reference {:.6g})", dl, dl_ref)
                                  : std::string("dlambda not compared (reference on fewer heads)")));
    rows.push_back(row("flash-attention", "forward+backward", H, t_at_fb, ws_at_f, none, none,
                       none, "causal MHA, same q/k/v shapes; workspace of the forward"));
  }
  print_table(rows);
  const std::string machine =
      fmt::format("{}, {} quiver threads", cpu_description(), num_threads());
  const std::string path = write_results(a.results_dir, "relation-cpu", machine, rows);
  fmt::print("wrote {}\n", path);
}

}  // namespace

void register_bench_relation(CLI::App& bench) {
  auto a = std::make_shared<RelationBenchArgs>();
  CLI::App* cmd = bench.add_subcommand(
      "relation",
      "Relation. CPU: materialized reference vs FlashRelation, forward and forward+backward, F32,\n"
      "B = 1, H = 8, Dh = 64, T = 1024 and 4096, with flash attention at the same shape; time,\n"
      "tokens per second, bytes of working arrays, and the flash/reference agreement (with\n"
      "--reference-heads below H, the reference runs on fewer heads at T >= 4096 and says so).\n"
      "CUDA: FlashRelation and flash attention forward + backward, bf16, at the paper's 10M, 30M\n"
      "and 100M scales (or --shapes), the backward modes of --dq, each checked on one head against\n"
      "float64, beside PyTorch SDPA (FlashAttention) and the materialized Relation run by --peer.");
  cmd->add_option("--device", a->device, "cpu or cuda")->capture_default_str();
  cmd->add_option("--shapes", a->shapes, "cuda: B:T:H:Dh,... (default the paper's three scales)");
  cmd->add_option("--dq", a->dq, "cuda: the backward modes to time, comma-separated (two-pass, one-pass)")
      ->capture_default_str();
  cmd->add_option("--runs", a->runs, "cuda: alternating trials")->check(CLI::Range(3, 1000))->capture_default_str();
  cmd->add_option("--peer", a->peer, "cuda: the PyTorch peer script (\"none\": skip it)")->capture_default_str();
  cmd->add_option("--peer-trials", a->peer_trials, "cuda: the peer's timed trials")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  cmd->add_option("--results-dir", a->results_dir, "where the JSON and Markdown results go")
      ->capture_default_str();
  cmd->add_option("--seq", a->seq, "comma-separated sequence lengths T")->capture_default_str();
  cmd->add_option("--heads", a->heads, "heads H")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--head-dim", a->head_dim, "head width Dh")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--tile", a->tile, "FlashRelation and attention tile")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--reference-heads", a->reference_heads_at_4096,
                  "heads the reference runs on at T >= 4096")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->callback([a] { run_bench(*a); });
}

}  // namespace quiver::cli

// `quiver bench algproj --device cpu`: OpenBLAS sgemm against the algebraic forward
// (and backward) at a few shapes and laws, same machine and threads, as ratios beside
// the ideal 1/ρ.
#include <fmt/format.h>

#include <algorithm>
#include <memory>

#include "algebra/law.h"
#include "bench_util.h"
#include "commands.h"
#include "core/blas.h"
#include "ops/algproj.h"
#include "quiver/parallel.h"
#include "quiver/rng.h"
#ifdef QUIVER_HAVE_CUDA
#include "cuda/algproj.h"
#include "cuda/algproj_bench.h"
#include "cuda/backend.h"
#endif

namespace quiver::cli {

namespace {

struct BenchArgs {
  std::string device = "cpu";
  std::string results_dir = "bench/results";
  std::string laws = "Q4,Q16,Q2xQ2,Q8";
  std::string schedule = "cyclic";
  int64_t M = 512, K = 2048, N = 2048;
  int reps = 15;
  bool backward = true;
  bool quick = false;
  // --device cuda (SPEC §1.6 grid)
  std::string m_list, q_list, model;
  bool paper_q = false;
  bool clock_probe = false;
};

std::vector<int64_t> parse_list(const std::string& text, const char* what) {
  std::vector<int64_t> out;
  if (text.empty()) return out;
  size_t start = 0;
  for (;;) {
    const size_t comma = text.find(',', start);
    const std::string item = text.substr(start, comma == std::string::npos ? comma : comma - start);
    size_t used = 0;
    int64_t v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    QV_CHECK(used == item.size() && !item.empty() && v > 0, "bench algproj: {}: '{}' is not a positive integer",
             what, item);
    out.push_back(v);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

// SPEC §1.6 on the GPU (cuda/algproj_bench.h): the grid, graphs, warm and flushed runs.
void run_cuda(const BenchArgs& a) {
#ifdef QUIVER_HAVE_CUDA
  QV_CHECK(cuda::device_count() > 0, "bench algproj --device cuda: no CUDA device found");
  cuda::register_backend();
  cuda::AlgProjBenchOptions options;
  if (!a.m_list.empty()) options.M = parse_list(a.m_list, "--m-list");
  for (int64_t q : parse_list(a.q_list, "--q-list")) options.q.push_back(static_cast<int>(q));
  options.paper_q_only = a.paper_q;
  options.backward = a.backward;
  options.model = a.model;
  options.runs = a.quick ? 5 : std::max(5, a.reps);
  options.clock_probe = a.clock_probe;
  nlohmann::ordered_json rows = nlohmann::ordered_json::array(), table = nlohmann::ordered_json::array();
  for (const cuda::AlgProjBenchRow& r : cuda::bench_algproj_cuda(options)) {
    nlohmann::ordered_json row;
    row["model"] = r.model;
    row["pass"] = r.pass;
    row["M"] = r.M;
    row["K"] = r.K;
    row["N"] = r.N;
    row["q"] = r.q;
    row["kernel"] = r.alg_kernel;
    row["dense"] = r.dense_kernel;
    row["dense_us"] = r.dense_us;
    row["alg_us"] = r.alg_us;
    row["speedup"] = r.speedup;
    row["paper_speedup"] = r.paper_speedup > 0 ? nlohmann::ordered_json(r.paper_speedup) : nlohmann::ordered_json();
    row["dense_flushed_us"] = r.dense_flushed_us;
    row["alg_flushed_us"] = r.alg_flushed_us;
    row["speedup_flushed"] = r.speedup_flushed;
    row["floor_us"] = r.floor_us;
    row["of_floor"] = r.of_floor;
    row["rel_error"] = r.rel_error;
    row["correct"] = r.correct;
    if (a.clock_probe) row["alg_after_idle_us"] = r.alg_after_idle_us;
    row["launch_us"] = r.launch_us;
    rows.push_back(row);
    nlohmann::ordered_json t;
    for (const char* k : {"model", "pass", "M", "q", "kernel", "dense_us", "alg_us", "speedup", "paper_speedup",
                          "speedup_flushed", "floor_us", "of_floor", "correct"})
      t[k] = row[k];
    if (a.clock_probe) t["alg_after_idle_us"] = row["alg_after_idle_us"];
    table.push_back(t);
  }
  std::string machine = fmt::format("{} (GPU), host {}", cuda::device_name(), cpu_description());
  print_table(table);
  std::string path = write_results(a.results_dir, "algproj-cuda", machine, rows);
  // Table 1's rows (the forwards with a paper speedup): ours against the paper's, and parity.
  nlohmann::ordered_json table1 = nlohmann::ordered_json::array();
  double most = 1;
  for (const auto& r : rows)
    if (r["pass"] == "forward" && r["paper_speedup"].is_number()) {
      table1.push_back(r);
      most = std::max({most, r["paper_speedup"].get<double>(), r["speedup"].get<double>()});
    }
  std::vector<train::PlotSeries> series = row_series(table1, "model", "paper_speedup", "speedup");
  series.push_back({"ours = paper's", {0, most}, {0, most}});
  train::PlotOptions plot;
  plot.title = fmt::format("Table 1 on {}: forward speedup over dense, ours against the paper's", cuda::device_name());
  plot.x_label = "the paper's speedup";
  plot.y_label = "our speedup (warm)";
  const std::string svg = write_plot(path, series, plot);
  fmt::print("machine: {}\nresults: {}\nplot: {}\n", machine, path, svg);
  for (const auto& r : rows)
    QV_CHECK(r["correct"].get<bool>(), "bench algproj: {} {} M={} q={} failed its correctness check (error {})",
             r["model"].get<std::string>(), r["pass"].get<std::string>(), r["M"].get<int64_t>(), r["q"].get<int>(),
             r["rel_error"].get<double>());
  // A kernel wrong at some shape is never timed, but it is still a bug.
  QV_CHECK(cuda::AlgProj::rejected_candidates() == 0,
           "bench algproj: calibration rejected {} candidate kernel(s) whose output disagreed with the products "
           "schedule (each named on stderr)",
           cuda::AlgProj::rejected_candidates());
#else
  fail("bench algproj --device cuda: this build has no CUDA backend");
#endif
}

void run(const BenchArgs& a) {
  if (a.device == "cuda") return run_cuda(a);
  QV_CHECK(a.device == "cpu", "bench algproj --device {}: expected cpu or cuda", a.device);
  const int reps = a.quick ? 3 : a.reps;
  Rng rng(1);
  Tensor x = Tensor::empty({a.M, a.K}, DType::F32), w = Tensor::empty({a.K, a.N}, DType::F32);
  Tensor dy = Tensor::empty({a.M, a.N}, DType::F32);
  rng.fill_normal(x);
  rng.fill_normal(w, 0, 0.02);
  rng.fill_normal(dy);
  Tensor y = Tensor::empty({a.M, a.N}, DType::F32), dx = Tensor::empty({a.M, a.K}, DType::F32);
  Tensor dw = Tensor::empty({a.K, a.N}, DType::F32);

  auto dense_fwd = [&] {
    blas::gemm(false, false, a.M, a.N, a.K, 1.0f, x.data<float>(), a.K, w.data<float>(), a.N, 0.0f,
               y.data<float>(), a.N);
  };
  auto dense_bwd = [&] {
    blas::gemm(false, true, a.M, a.K, a.N, 1.0f, dy.data<float>(), a.N, w.data<float>(), a.N, 0.0f,
               dx.data<float>(), a.K);
    blas::gemm(true, false, a.K, a.N, a.M, 1.0f, x.data<float>(), a.K, dy.data<float>(), a.N, 0.0f,
               dw.data<float>(), a.N);
  };
  // Alternate dense and algebraic trials so that drift hits both alike; the algebraic
  // side is timed with rows in place and gathered, and the better one counts.
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  algebra::Schedule schedule = algebra::Schedule::parse(a.schedule);
  for (const std::string& spec : [&] {
         std::vector<std::string> v;
         size_t s = 0;
         for (;;) {
           size_t p = a.laws.find(',', s);
           v.push_back(a.laws.substr(s, p == std::string::npos ? p : p - s));
           if (p == std::string::npos) break;
           s = p + 1;
         }
         return v;
       }()) {
    algebra::Law law = algebra::Law::parse(spec);
    algebra::GroupWidths widths = algebra::GroupWidths::equal(law.q(), a.K, a.N);
    ops::AlgProj in_place(law, widths, ops::RowAccess::InPlace),
        gather(law, widths, ops::RowAccess::Gather);
    std::vector<int> types = schedule.types(0, a.M, law.q());
    double rho = algebra::arithmetic_fraction(law, widths);
    dense_fwd();
    std::vector<double> td, ta_in, ta_ga, tdb, tab_in, tab_ga;
    for (int r = 0; r < reps; ++r) {
      td.push_back(time_it(dense_fwd, 0, 1).median_s);
      ta_in.push_back(
          time_it([&] { in_place.forward(x, w, types, y); }, r == 0 ? 1 : 0, 1).median_s);
      ta_ga.push_back(time_it([&] { gather.forward(x, w, types, y); }, r == 0 ? 1 : 0, 1).median_s);
      if (a.backward) {
        tdb.push_back(time_it(dense_bwd, 0, 1).median_s);
        tab_in.push_back(
            time_it([&] { in_place.backward(x, w, dy, types, &dx, &dw); }, 0, 1).median_s);
        tab_ga.push_back(
            time_it([&] { gather.backward(x, w, dy, types, &dx, &dw); }, 0, 1).median_s);
      }
    }
    auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    double d = median(td), al_in = median(ta_in), al_ga = median(ta_ga),
           al = std::min(al_in, al_ga);
    nlohmann::ordered_json row;
    row["law"] = law.name();
    row["schedule"] = schedule.name();
    row["M"] = a.M;
    row["K"] = a.K;
    row["N"] = a.N;
    row["dense_fwd_ms"] = d * 1e3;
    row["alg_inplace_ms"] = al_in * 1e3;
    row["alg_gather_ms"] = al_ga * 1e3;
    row["fwd_speedup"] = d / al;
    row["ideal"] = 1.0 / rho;
    row["fwd_of_ideal"] = (d / al) * rho;
    row["alg_fwd_gflops"] = 2.0 * a.M * a.K * a.N * rho / al * 1e-9;
    if (a.backward) {
      double db = median(tdb), ab = std::min(median(tab_in), median(tab_ga));
      row["dense_bwd_ms"] = db * 1e3;
      row["alg_bwd_ms"] = ab * 1e3;
      row["bwd_speedup"] = db / ab;
    }
    rows.push_back(row);
  }
  std::string machine = fmt::format("{}, {} threads (OpenBLAS {})", cpu_description(),
                                    num_threads(), blas::threads());
  print_table(rows);
  std::string path = write_results(a.results_dir, "algproj-cpu", machine, rows);
  fmt::print("machine: {}\nresults: {}\n", machine, path);
}

}  // namespace

void register_bench_algproj(CLI::App& bench) {
  auto args = std::make_shared<BenchArgs>();
  CLI::App* cmd = bench.add_subcommand(
      "algproj",
      "Algebraic projection against dense GEMM, forward and backward. CPU: OpenBLAS sgemm, with\n"
      "the ideal speedup 1/ρ. CUDA: the SPEC §1.6 protocol (Qwen3/DeepSeek expansion shapes, Q_q\n"
      "with cyclic rows, dense = faster of cuBLAS and cuBLASLt, CUDA graphs, warm and L2-flushed,\n"
      "floors, the paper's Table 1 beside ours). Trials alternate and medians are reported.");
  cmd->add_option("--device", args->device, "cpu or cuda")->capture_default_str();
  cmd->add_option("--laws", args->laws, "comma-separated laws")->capture_default_str();
  cmd->add_option("--schedule", args->schedule, "row-type schedule")->capture_default_str();
  cmd->add_option("-M", args->M, "rows")->capture_default_str();
  cmd->add_option("-K", args->K, "input features")->capture_default_str();
  cmd->add_option("-N", args->N, "output features")->capture_default_str();
  cmd->add_option("--reps", args->reps, "timed trials per side")->capture_default_str();
  cmd->add_flag("!--no-backward", args->backward, "time the forward only");
  cmd->add_flag("--quick", args->quick, "3 trials (smoke run; 5 on the GPU)");
  cmd->add_option("--m-list", args->m_list, "cuda: rows M, comma-separated (default 1,32,512,2048; Qwen3-32B adds "
                                            "8192,32768)");
  cmd->add_option("--q-list", args->q_list, "cuda: q values (default 4..64, Qwen3-32B to 256)");
  cmd->add_flag("--paper-q", args->paper_q, "cuda: only each shape's q* of the paper's Table 1");
  cmd->add_flag("--clock-probe", args->clock_probe,
                "cuda: also time the algebraic call 30 ms after a dense call (the GPU's clock rested)");
  cmd->add_option("--model", args->model, "cuda: only shapes whose name contains this");
  cmd->add_option("--results-dir", args->results_dir, "where results are written")
      ->capture_default_str();
  cmd->callback([args] { run(*args); });
}

}  // namespace quiver::cli

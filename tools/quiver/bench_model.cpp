// `quiver bench model --device cuda`: whole-model throughput on the GPU — training steps
// (forward, backward, clipping, AdamW) of presets at given micro-batch and length, with MFU,
// and generation (decode + sampling, CUDA-graph replay) at several batch sizes. Random
// initialization and random token ids: throughput does not depend on the weights. The PyTorch
// peer of the training numbers is bench/peer_train.py, run in the same session.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <sstream>

#include "bench_util.h"
#include "commands.h"
#include "model/config.h"
#include "model/model.h"
#include "quiver/error.h"
#include "quiver/rng.h"
#include "train/engine.h"
#include "train/optimizer.h"
#ifdef QUIVER_HAVE_CUDA
#include "cuda/backend.h"
#include "cuda/check.h"
#include "cuda/generate.h"
#include "cuda/model.h"
#include "cuda/op_timer.h"
#include "cuda/train_engine.h"
#endif

namespace quiver::cli {

namespace {

constexpr double kPeakFlops = 790e12;  // H200 dense bf16 (shared/PERF.md)

struct ModelBenchArgs {
  std::string device = "cuda";
  std::string results_dir = "bench/results";
  // config:micro:T entries; the three runs by default.
  std::string train = "rel10m-mha:64:1024,rel100m-mha:4:4096,alg110m-dense:40:1536";
  std::string generate = "alg110m-dense";
  std::string gen_batches = "1,32,64";
  int64_t new_tokens = 256, prompt_tokens = 16;
  int steps = 10, warmup = 3;
  bool greedy = false;
  bool profile = false;
};

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, sep))
    if (!item.empty()) out.push_back(item);
  return out;
}

std::vector<int32_t> random_ids(int64_t n, int64_t V, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = static_cast<int32_t>(rng.uniform(0.0, static_cast<double>(V)));
  return v;
}

// Mixer FLOPs per token, forward + backward, as bench/peer_train.py counts attention: 6·T·D
// per A or F layer (causal half of QKᵀ and PV, backward twice the forward); L layers count
// their chunked form as O(Dh) per token and are left out.
double mixer_flops_per_token(const model::ModelConfig& c, int64_t T) {
  int64_t quadratic = 0;
  for (char k : c.pattern) quadratic += k == 'A' || k == 'F';
  return 6.0 * static_cast<double>(quadratic) * static_cast<double>(T) * static_cast<double>(c.d_model);
}

#ifdef QUIVER_HAVE_CUDA
// Prints a timer's table (ms per `per` units and share) and returns it as rows.
void print_profile(const std::string& title, cuda::OpTimer& timer, double per, nlohmann::ordered_json& out) {
  const auto times = timer.take();
  double total = 0;
  for (const auto& [label, ms] : times) total += ms;
  fmt::print("{}: {:.3f} ms in marked ops\n", title, total / per);
  for (const auto& [label, ms] : times) {
    fmt::print("  {:<40} {:9.3f} ms  {:5.1f}%\n", label, ms / per, 100 * ms / total);
    nlohmann::ordered_json r;
    r["profile"] = title;
    r["op"] = label;
    r["ms"] = ms / per;
    r["share"] = ms / total;
    out.push_back(r);
  }
}
#endif

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

void run_bench(const ModelBenchArgs& a) {
#ifdef QUIVER_HAVE_CUDA
  QV_CHECK(a.device == "cuda", "bench model --device {}: only cuda is benchmarked here (CPU: bench/train_cpu.sh)",
           a.device);
  QV_CHECK(cuda::device_count() > 0, "bench model --device cuda: no CUDA device found");
  cuda::register_backend();
  cuda::register_train_engine();
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  nlohmann::ordered_json profile_rows = nlohmann::ordered_json::array();

  for (const std::string& entry : split(a.train, ',')) {
    const std::vector<std::string> f = split(entry, ':');
    QV_CHECK(f.size() == 3 || f.size() == 4, "--train: expected CONFIG:MICRO:T[:ACCUM], got '{}'", entry);
    const model::ModelConfig cfg = model::load_config(f[0]);
    const int64_t B = std::stoll(f[1]), T = std::stoll(f[2]), accum = f.size() == 4 ? std::stoll(f[3]) : 1;
    QV_CHECK(B >= 1 && T >= 1 && accum >= 1, "--train '{}': MICRO, T and ACCUM must be positive", entry);
    QV_CHECK(T <= cfg.context, "--train '{}': T = {} exceeds the config's context {}", entry, T, cfg.context);
    size_t free_before = 0, total_mem = 0;
    QV_CUDA_CHECK(cudaDeviceSynchronize());
    QV_CUDA_CHECK(cudaMemGetInfo(&free_before, &total_mem));
    model::Model host(cfg, DType::F32);
    host.init(cfg.seed);
    std::vector<train::ParamSegment> segments;
    for (const model::ParamInfo& p : host.param_table()) segments.push_back({p.offset, p.numel, p.decay, p.trainable});
    train::AdamW adam(segments, host.num_params(), train::AdamWOptions{});
    auto engine = train::make_engine("cuda", host, adam);
    const std::vector<int32_t> data = random_ids(B * (T + 1), cfg.vocab_size, 1);
    std::vector<int32_t> x(B * T), y(B * T);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t) {
        x[b * T + t] = data[b * (T + 1) + t];
        y[b * T + t] = data[b * (T + 1) + t + 1];
      }
    // One optimizer step over ACCUM micro-batches (the same tokens each time: the time, not the
    // data, is measured).
    auto step = [&] {
      engine->zero_grads();
      for (int64_t k = 0; k < accum; ++k)
        engine->forward_backward(x.data(), y.data(), B, T, 1.0f / static_cast<float>(accum), k + 1 == accum);
      return engine->optimizer_step(3e-4, 1.0);  // waits for the device
    };
    Clock::time_point t0 = Clock::now();
    step();
    const double first_s = since(t0);
    // Device memory the model, its optimizer state, activations and scratch hold (after the
    // first step, which allocates them all).
    size_t free_after = 0;
    QV_CUDA_CHECK(cudaMemGetInfo(&free_after, &total_mem));
    const double device_mib = static_cast<double>(free_before - std::min(free_before, free_after)) / (1 << 20);
    for (int i = 1; i < a.warmup; ++i) step();
    std::vector<double> times;
    double loss = 0;
    for (int i = 0; i < a.steps; ++i) {
      t0 = Clock::now();
      loss = step().loss_sum / static_cast<double>(accum);  // the micro-batches' mean loss
      times.push_back(since(t0));
    }
    std::sort(times.begin(), times.end());
    const double median = times[times.size() / 2];
    const double tok_s = static_cast<double>(B * T * accum) / median;
    const double n = static_cast<double>(model::count_params(cfg));
    const double mfu = (6.0 * n + mixer_flops_per_token(cfg, T)) * tok_s / kPeakFlops;
    nlohmann::ordered_json r;
    r["benchmark"] = "train";
    r["config"] = cfg.name;
    r["micro_x_T"] = accum == 1 ? fmt::format("{} x {}", B, T) : fmt::format("{} x {} x {} accum", B, T, accum);
    r["params"] = model::count_params(cfg);
    r["step_ms"] = median * 1e3;
    r["tokens_per_s"] = tok_s;
    r["mfu"] = mfu;
    r["mfu_6n"] = 6.0 * n * tok_s / kPeakFlops;
    r["first_step_s"] = first_s;
    r["loss"] = loss;
    r["device_mib"] = device_mib;
    rows.push_back(r);
    fmt::print("train {} {}x{}{}: {:.1f} ms/step, {:.0f} tok/s, MFU {:.1f}%, {:.0f} MiB on the device\n", cfg.name,
               B, T, accum == 1 ? std::string() : fmt::format(" x{} accum", accum), median * 1e3, tok_s, 100 * mfu,
               device_mib);
    if (a.profile) {
      cuda::OpTimer* timer = cuda::engine_timer(*engine);
      timer->enable(true);
      step();
      timer->enable(false);
      print_profile(fmt::format("train step {} {}x{}", cfg.name, B, T), *timer, 1.0, profile_rows);
    }
  }

  for (const std::string& name : split(a.generate, ',')) {
    const model::ModelConfig cfg = model::load_config(name);
    model::Model host(cfg, DType::F32);
    host.init(cfg.seed);
    cuda::GpuModel gpu(cfg);
    gpu.load_params(host.params());
    for (const std::string& bs : split(a.gen_batches, ',')) {
      const int64_t B = std::stoll(bs);
      std::vector<std::vector<int32_t>> prompts;
      for (int64_t b = 0; b < B; ++b) prompts.push_back(random_ids(a.prompt_tokens, cfg.vocab_size, 100 + b));
      infer::SamplerOptions so;  // the algebra paper's protocol (SPEC §1.5)
      so.temperature = 0.8;
      so.top_k = 50;
      so.top_p = 0.95;
      so.greedy = a.greedy;
      for (const bool graphs : {true, false}) {
        std::vector<infer::Sampler> samplers;
        for (int64_t b = 0; b < B; ++b) {
          so.seed = static_cast<uint64_t>(b);
          samplers.emplace_back(so);
        }
        cuda::GpuGenerateOptions go;
        go.graphs = graphs;
        cuda::generate_tokens(gpu, prompts, a.new_tokens, samplers, {}, {}, nullptr, go);  // warm-up
        infer::DecodeTiming timing;
        const auto out = cuda::generate_tokens(gpu, prompts, a.new_tokens, samplers, {}, {}, &timing, go);
        int64_t produced = 0;
        for (const auto& c : out) produced += static_cast<int64_t>(c.tokens.size());
        const double s = timing.decode_s + timing.stop_check_s;
        nlohmann::ordered_json r;
        r["benchmark"] = fmt::format("generate{} ({})", a.greedy ? " greedy" : "", graphs ? "CUDA graph" : "eager launches");
        r["config"] = cfg.name;
        r["micro_x_T"] = fmt::format("batch {}, {} + {} tokens", B, a.prompt_tokens, a.new_tokens);
        r["params"] = model::count_params(cfg);
        r["step_ms"] = 1e3 * s / static_cast<double>(a.new_tokens);
        r["tokens_per_s"] = static_cast<double>(produced) / s;
        r["mfu"] = "-";
        r["mfu_6n"] = "-";
        r["first_step_s"] = timing.prefill_s;
        r["loss"] = "-";
        rows.push_back(r);
        fmt::print("generate {} batch {} ({}): {:.0f} tok/s, {:.3f} ms per token step\n", cfg.name, B,
                   graphs ? "graphs" : "eager", static_cast<double>(produced) / s, 1e3 * s / a.new_tokens);
      }
      if (a.profile) {
        std::vector<infer::Sampler> samplers;
        for (int64_t b = 0; b < B; ++b) samplers.emplace_back(so);
        gpu.timer().enable(true);
        cuda::generate_tokens(gpu, prompts, a.new_tokens, samplers, {}, {}, nullptr, {});
        gpu.timer().enable(false);
        print_profile(fmt::format("decode step {} batch {} (eager, per token)", cfg.name, B), gpu.timer(),
                      static_cast<double>(a.new_tokens), profile_rows);
      }
    }
  }
  print_table(rows);
  const std::string machine = fmt::format("{} (GPU), host {}", cuda::device_name(), cpu_description());
  fmt::print("wrote {}\n", write_results(a.results_dir, "model-cuda", machine, rows));
  if (!profile_rows.empty())
    fmt::print("wrote {}\n", write_results(a.results_dir, "model-cuda-profile", machine, profile_rows));
#else
  (void)a;
  fail("bench model --device cuda: this build has no CUDA backend");
#endif
}

}  // namespace

void register_bench_model(CLI::App& bench) {
  auto a = std::make_shared<ModelBenchArgs>();
  CLI::App* cmd = bench.add_subcommand(
      "model",
      "Whole models on the GPU: training tok/s and MFU of presets (random tokens, AdamW, clip 1.0),\n"
      "and generation tok/s (temperature 0.8, top-k 50, top-p 0.95; graph replay and eager) at\n"
      "several batch sizes. The PyTorch peer is bench/peer_train.py.");
  cmd->add_option("--device", a->device, "cuda")->capture_default_str();
  cmd->add_option("--results-dir", a->results_dir, "where the JSON and Markdown results go")->capture_default_str();
  cmd->add_option("--train", a->train,
                  "CONFIG:MICRO:T[:ACCUM],... (ACCUM micro-batches per optimizer step; empty: none)")
      ->capture_default_str();
  cmd->add_option("--generate", a->generate, "configs to generate with (empty: none)")->capture_default_str();
  cmd->add_option("--batches", a->gen_batches, "generation batch sizes")->capture_default_str();
  cmd->add_option("--new-tokens", a->new_tokens, "new tokens per sequence")->capture_default_str();
  cmd->add_option("--prompt-tokens", a->prompt_tokens, "prompt tokens per sequence")->capture_default_str();
  cmd->add_flag("--profile", a->profile,
                "also time each op of one training step and of the decode steps (CUDA events; eager)");
  cmd->add_flag("--greedy", a->greedy, "generate greedily instead of sampling (isolates the sampler's cost)");
  cmd->add_option("--steps", a->steps, "timed training steps")->capture_default_str();
  cmd->add_option("--warmup", a->warmup, "untimed training steps first")->capture_default_str();
  cmd->callback([a] { run_bench(*a); });
}

}  // namespace quiver::cli

// The GPU language model against the CPU model: loss and every parameter gradient for each
// mixer (A, F, L), FFN law, norm and position kind; decoding with caches against the full
// forward; 50 training steps following the CPU loss curve; sampling on the GPU against the
// CPU sampler's distribution; graph-captured generation against eager steps.
//
// Tolerances. The GPU model rounds weights, activations and activation gradients to bf16
// (unit roundoff u = 2⁻⁸ relative to a value, 2⁻⁹ for round-to-nearest) at every op boundary,
// about 15 roundings per layer on the way to a parameter gradient; the errors are independent,
// so they add in quadrature and a whole-model relative error of about √(15·L)·2⁻⁹ ≈ 1.5% for
// L = 4 layers is expected, more for small tensors whose gradient is a difference of large
// terms. The bounds below are 4% for the loss-relevant outputs (logits, the full gradient
// vector) and 15% for each parameter tensor, i.e. a few times the expected error: a wrong
// kernel (a missed term, a transposed operand) is off by O(1).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cuda/generate.h"
#include "cuda/model.h"
#include "cuda/sampler.h"
#include "cuda/train_engine.h"
#include "gpu_testing.h"
#include "infer/sampler.h"
#include "model/config.h"
#include "model/model.h"
#include "quiver/rng.h"
#include "train/engine.h"
#include "train/optimizer.h"

using namespace quiver;
using quiver::gpu_testing::have_gpu;

namespace {

// A small model: vocab 97, context 80, D = 64, 4 heads of 16; overrides edit the JSON.
model::ModelConfig small_config(const std::string& pattern, const nlohmann::json& overrides = nlohmann::json::object()) {
  nlohmann::json j = {{"name", "gpu-test"}, {"vocab_size", 97}, {"context", 80}, {"d_model", 64}, {"n_heads", 4},
                      {"n_layers", static_cast<int64_t>(pattern.size())}, {"pattern", pattern},
                      {"ffn", {{"kind", "swiglu"}, {"width", 128}}}, {"init_std", 0.08}};
  for (auto& [key, value] : overrides.items()) {
    if (value.is_object() && j.contains(key))
      for (auto& [k2, v2] : value.items()) j[key][k2] = v2;
    else
      j[key] = value;
  }
  return model::config_from_json(j);
}

// Initializes, then moves every parameter off its special initial value (norm weights 1,
// biases 0, θ 0, λ 0.5) so that every path carries gradient.
void randomize(model::Model& m, uint64_t seed) {
  m.init(seed);
  Rng rng(seed + 1);
  for (const model::ParamInfo& p : m.param_table()) {
    Tensor t = m.param(p.name);
    const std::string& n = p.name;
    const bool special = n.find("norm") != std::string::npos || n.find("theta") != std::string::npos ||
                         n.find("lambda") != std::string::npos || p.shape.size() == 1;
    if (!special) continue;
    if (n.find("a_log") != std::string::npos || n.find("dt_bias") != std::string::npos) continue;
    Tensor noise = Tensor::empty(p.shape, DType::F32);
    rng.fill_normal(noise, 0.0, 0.2);
    float* d = t.data<float>();
    const float* e = noise.data<float>();
    const bool weight = n.find("weight") != std::string::npos;
    for (int64_t i = 0; i < p.numel; ++i) d[i] = (weight ? 1.0f : (n.find("lambda") != std::string::npos ? 0.5f : 0.0f)) + e[i];
  }
}

std::vector<int32_t> random_ids(int64_t n, int64_t V, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = static_cast<int32_t>(rng.uniform(0.0, static_cast<double>(V)));
  return v;
}

double rel_error(const double* a, const double* ref, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    num += (a[i] - ref[i]) * (a[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

struct Case {
  std::string name, pattern;
  nlohmann::json overrides;
};

std::vector<Case> model_cases() {
  return {
      {"mha_rope_rmsnorm", "AA", nlohmann::json::object()},
      {"mha_gqa_learned_layernorm_bias_untied", "AA",
       {{"n_kv_heads", 2}, {"positions", "learned"}, {"norm", "layernorm"}, {"attn_bias", true},
        {"tied_head", false}, {"ffn", {{"bias", true}}}}},
      {"mha_learned_layernorm_bias", "AA",
       {{"positions", "learned"}, {"norm", "layernorm"}, {"attn_bias", true}, {"ffn", {{"bias", true}}}}},
      {"gelu_ffn", "A", {{"ffn", {{"kind", "gelu"}}}}},
      {"algebraic_ffn_q2x2_interval", "AA", {{"ffn", {{"law", "Q2xQ2"}, {"schedule", "interval:32"}}}}},
      {"algebraic_ffn_q4_cyclic", "A", {{"ffn", {{"law", "Q4"}, {"schedule", "cyclic"}}}}},
      {"full_relation", "FF", nlohmann::json::object()},
      {"full_relation_bias", "F", {{"attn_bias", true}}},
      {"relation_exchange_only_raw_x", "F", {{"relation", {{"exchange_only", true}, {"raw_x", true}}}}},
      {"relation_frozen_lambda_no_givens", "F", {{"relation", {{"lambda_frozen", true}, {"givens", false}}}}},
      {"linear_relation", "LL", nlohmann::json::object()},
      {"hybrid", "LLFA", {{"ffn", {{"law", "Q2xQ2"}, {"schedule", "interval:64"}}}}},
  };
}

class GpuModelCase : public ::testing::TestWithParam<Case> {};

TEST_P(GpuModelCase, LossAndGradientsMatchTheCpuModel) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const Case& c = GetParam();
  const model::ModelConfig cfg = small_config(c.pattern, c.overrides);
  model::Model cpu(cfg, DType::F32);
  randomize(cpu, 7);
  // The float64 reference runs on the bf16-rounded parameters the GPU multiplies with.
  model::Model ref(cfg, DType::F64);
  ref.params().copy_from(cpu.params().to(DType::BF16));
  cuda::GpuModel gpu(cfg);
  gpu.load_params(cpu.params());

  const int64_t B = 3, T = 70;  // T not a multiple of 64
  const std::vector<int32_t> tokens = random_ids(B * T, cfg.vocab_size, 11);
  std::vector<int32_t> targets = random_ids(B * T, cfg.vocab_size, 12);
  targets[5] = -1;  // an ignored target
  const double ref_loss = ref.forward_backward(tokens.data(), targets.data(), B, T, 1.0f);
  gpu.zero_grads();
  gpu.forward_backward(tokens.data(), targets.data(), B, T, 1.0f);
  const double gpu_loss = gpu.take_loss_sum();
  EXPECT_NEAR(gpu_loss, ref_loss, 0.04 * ref_loss) << c.name;
  EXPECT_NEAR(gpu.forward_loss(tokens.data(), targets.data(), B, T), ref_loss, 0.04 * ref_loss) << c.name;

  const Tensor g = gpu_testing::to_host_f64(gpu.grads());
  const Tensor r = ref.grads();
  const double total = rel_error(g.data<double>(), r.data<double>(), g.numel());
  EXPECT_LT(total, 0.04) << c.name << ": whole gradient";
  double total_norm = 0;
  for (int64_t i = 0; i < r.numel(); ++i) total_norm += r.data<double>()[i] * r.data<double>()[i];
  total_norm = std::sqrt(total_norm);
  for (const model::ParamInfo& p : cpu.param_table()) {
    const double* gp = g.data<double>() + p.offset;
    const double* rp = r.data<double>() + p.offset;
    double ref_norm = 0;
    for (int64_t i = 0; i < p.numel; ++i) ref_norm += rp[i] * rp[i];
    if (!p.trainable) {
      for (int64_t i = 0; i < p.numel; ++i) EXPECT_EQ(gp[i], 0.0) << p.name << " is frozen";
      continue;
    }
    double gpu_norm = 0;
    for (int64_t i = 0; i < p.numel; ++i) gpu_norm += gp[i] * gp[i];
    if (std::sqrt(ref_norm) < 1e-6 * total_norm) {
      // Zero by symmetry (the key bias: q·b_k is the same for every key of a query, and the
      // softmax ignores it); the GPU's is bf16 noise, small against the whole gradient.
      EXPECT_LT(std::sqrt(gpu_norm), 1e-2 * total_norm) << c.name << ": " << p.name;
      continue;
    }
    EXPECT_LT(rel_error(gp, rp, p.numel), 0.15) << c.name << ": " << p.name;
  }

  // Logits of the forward.
  const Tensor logits = gpu.forward_logits(tokens.data(), B, T);
  Tensor ref_logits;
  ref.forward_logits(tokens.data(), B, T, ref_logits);
  const Tensor l64 = logits.to(DType::F64);
  EXPECT_LT(rel_error(l64.data<double>(), ref_logits.data<double>(), l64.numel()), 0.04) << c.name;
}

// The backward's reports (GpuModel::GradientsFinal) are what a data-parallel engine starts
// its reductions on. At each report, after the stream has run up to it, the gradients it calls
// final must already equal the ones after the whole backward, bit for bit, while the next
// stage's still change (the report comes before that work, so communication can overlap it).
// The micro-batch accumulates onto a first one's gradients, as the last one of a step does.
TEST_P(GpuModelCase, BackwardReportsFinalGradientsStageByStage) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const Case& c = GetParam();
  const model::ModelConfig cfg = small_config(c.pattern, c.overrides);
  model::Model cpu(cfg, DType::F32);
  randomize(cpu, 7);
  cuda::GpuModel gpu(cfg);
  gpu.load_params(cpu.params());
  const int64_t B = 2, T = 70, P = gpu.num_params();
  const std::vector<int32_t> x1 = random_ids(B * T, cfg.vocab_size, 21), y1 = random_ids(B * T, cfg.vocab_size, 22);
  const std::vector<int32_t> x2 = random_ids(B * T, cfg.vocab_size, 23), y2 = random_ids(B * T, cfg.vocab_size, 24);
  gpu.zero_grads();
  gpu.forward_backward(x1.data(), y1.data(), B, T, 0.5f);
  std::vector<size_t> reported;
  std::vector<Tensor> snapshots;
  gpu.forward_backward(x2.data(), y2.data(), B, T, 0.5f, [&](size_t first_final) {
    reported.push_back(first_final);
    snapshots.push_back(gpu_testing::to_host(gpu.grads()));
  });
  const Tensor final_grads = gpu_testing::to_host(gpu.grads());
  ASSERT_EQ(reported, model::backward_stage_starts(cfg)) << c.name;
  const std::vector<model::ParamInfo>& table = gpu.param_table();
  auto offset_of = [&](size_t entry) { return entry < table.size() ? table[entry].offset : P; };
  const float* want = final_grads.data<float>();
  for (size_t k = 0; k < reported.size(); ++k) {
    const float* got = snapshots[k].data<float>();
    const int64_t from = offset_of(reported[k]);
    EXPECT_EQ(std::memcmp(got + from, want + from, static_cast<size_t>(P - from) * sizeof(float)), 0)
        << c.name << ": gradients from entry " << reported[k] << " (" << table[reported[k]].name
        << ") changed after they were reported final";
    if (k + 1 < reported.size()) {
      const int64_t next = offset_of(reported[k + 1]);
      EXPECT_NE(std::memcmp(got + next, want + next, static_cast<size_t>(from - next) * sizeof(float)), 0)
          << c.name << ": the stage after report " << k << " had already run when it was reported";
    }
  }
}

TEST_P(GpuModelCase, DecodingReproducesTheFullForward) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const Case& c = GetParam();
  const model::ModelConfig cfg = small_config(c.pattern, c.overrides);
  model::Model cpu(cfg, DType::F32);
  randomize(cpu, 9);
  cuda::GpuModel gpu(cfg);
  gpu.load_params(cpu.params());
  const int64_t B = 2, T = 75, L = 9;
  const std::vector<int32_t> tokens = random_ids(B * T, cfg.vocab_size, 21);
  const Tensor full = gpu.forward_logits(tokens.data(), B, T).to(DType::F64);  // [B, T, V]
  const int64_t V = cfg.vocab_size;

  auto state = gpu.new_decode_state(B, T);
  std::vector<int32_t> prompt(static_cast<size_t>(B * L));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < L; ++t) prompt[b * L + t] = tokens[b * T + t];
  gpu.prefill(*state, prompt.data(), B, L);
  for (int64_t p = L - 1; p < T; ++p) {
    if (p >= L) {
      std::vector<int32_t> column(static_cast<size_t>(B));
      for (int64_t b = 0; b < B; ++b) column[b] = tokens[b * T + p];
      QV_CUDA_CHECK(cudaMemcpy(state->tokens(), column.data(), sizeof(int32_t) * B, cudaMemcpyHostToDevice));
      gpu.decode_step(*state);
    }
    ASSERT_EQ(state->position(), p + 1);
    const Tensor step = gpu_testing::to_host_f64(state->logits());
    for (int64_t b = 0; b < B; ++b) {
      const double* want = full.data<double>() + (b * T + p) * V;
      EXPECT_LT(rel_error(step.data<double>() + b * V, want, V), 0.03) << c.name << " b " << b << " p " << p;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Configs, GpuModelCase, ::testing::ValuesIn(model_cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

// Gradients accumulate over micro-batches: two forward-backward calls leave the sum of what each
// leaves alone. The folded Givens mixing sets W_I's gradient aside around its projection's
// backward, so this checks that nothing accumulated before is lost (biases included).
TEST(GpuModelAccumulation, TwoMicroBatchesLeaveTheSumOfTheirGradients) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (const auto& [pattern, overrides] : std::vector<std::pair<std::string, nlohmann::json>>{
           {"FL", {{"attn_bias", true}}}, {"FA", nlohmann::json::object()}}) {
    const model::ModelConfig cfg = small_config(pattern, overrides);
    model::Model cpu(cfg, DType::F32);
    randomize(cpu, 5);
    cuda::GpuModel gpu(cfg);
    gpu.load_params(cpu.params());
    const int64_t B = 2, T = 40;
    const std::vector<int32_t> x1 = random_ids(B * T, cfg.vocab_size, 31), y1 = random_ids(B * T, cfg.vocab_size, 32);
    const std::vector<int32_t> x2 = random_ids(B * T, cfg.vocab_size, 33), y2 = random_ids(B * T, cfg.vocab_size, 34);
    auto grads_of = [&](const std::vector<const std::vector<int32_t>*>& batches) {
      gpu.zero_grads();
      for (size_t i = 0; i < batches.size(); i += 2) gpu.forward_backward(batches[i]->data(), batches[i + 1]->data(), B, T, 0.5f);
      gpu.take_loss_sum();
      return gpu_testing::to_host_f64(gpu.grads());
    };
    const Tensor g1 = grads_of({&x1, &y1}), g2 = grads_of({&x2, &y2}), both = grads_of({&x1, &y1, &x2, &y2});
    std::vector<double> sum(static_cast<size_t>(g1.numel()));
    for (int64_t i = 0; i < g1.numel(); ++i) sum[i] = g1.data<double>()[i] + g2.data<double>()[i];
    double total = 0;
    for (double v : sum) total += v * v;
    for (const model::ParamInfo& p : cpu.param_table()) {
      if (!p.trainable) continue;
      // fp32 sums in another order: a few ulps of the larger term, against the tensor's norm
      // (or a thousandth of the whole gradient's, for tensors near zero by symmetry).
      double diff = 0, norm = 0;
      for (int64_t i = p.offset; i < p.offset + p.numel; ++i) {
        const double d = both.data<double>()[i] - sum[i];
        diff += d * d;
        norm += sum[i] * sum[i];
      }
      EXPECT_LT(std::sqrt(diff), 1e-5 * std::max(std::sqrt(norm), 1e-3 * std::sqrt(total))) << pattern << ": " << p.name;
    }
  }
}

// A corpus with structure (a noisy repeating pattern) so that the loss falls.
std::vector<int32_t> patterned_ids(int64_t n, int64_t V, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    v[i] = rng.uniform() < 0.1 ? static_cast<int32_t>(rng.uniform(0.0, double(V))) : static_cast<int32_t>((i * 7) % 31);
  return v;
}

TEST(GpuTraining, FiftyStepsFollowTheCpuLossCurve) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  cuda::register_train_engine();
  const model::ModelConfig cfg = small_config("LFA", {{"ffn", {{"law", "Q2xQ2"}, {"schedule", "interval:64"}}}});
  const int64_t B = 4, T = 64, steps = 50;
  std::vector<std::vector<double>> curves;
  for (const char* device : {"cpu", "cuda"}) {
    model::Model m(cfg, DType::F32);
    m.init(5);
    std::vector<train::ParamSegment> segments;
    for (const model::ParamInfo& p : m.param_table()) segments.push_back({p.offset, p.numel, p.decay, p.trainable});
    train::AdamW adam(segments, m.num_params(), train::AdamWOptions{});
    auto engine = train::make_engine(device, m, adam);
    std::vector<double> curve;
    for (int64_t s = 0; s < steps; ++s) {
      const std::vector<int32_t> data = patterned_ids(B * (T + 1), cfg.vocab_size, 100 + s);
      std::vector<int32_t> x(B * T), y(B * T);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0; t < T; ++t) {
          x[b * T + t] = data[b * (T + 1) + t];
          y[b * T + t] = data[b * (T + 1) + t + 1];
        }
      engine->zero_grads();
      engine->forward_backward(x.data(), y.data(), B, T, 1.0f, true);
      curve.push_back(engine->optimizer_step(3e-3, 1.0).loss_sum);
    }
    engine->sync_to_host();
    EXPECT_EQ(adam.steps_taken(), steps) << device;
    curves.push_back(curve);
  }
  double worst = 0;
  for (int64_t s = 0; s < steps; ++s) worst = std::max(worst, std::fabs(curves[0][s] - curves[1][s]));
  // The loss falls from about log(97) = 4.6; bf16 training stays within 0.05 nats of fp32.
  EXPECT_LT(curves[1].back(), curves[1].front() - 1.0) << "the GPU run did not learn";
  EXPECT_LT(worst, 0.05) << "largest |loss_gpu − loss_cpu| over " << steps << " steps";
  std::printf("50-step loss: cpu %.4f -> %.4f, gpu %.4f -> %.4f, max |diff| %.4f\n", curves[0].front(),
              curves[0].back(), curves[1].front(), curves[1].back(), worst);
}

// Sampling on the GPU: every drawn token is in the CPU sampler's kept set, and the empirical
// distribution over 4096 draws is within a total-variation distance that 4096 draws explain.
TEST(GpuSampler, DrawsTheCpuSamplersDistribution) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const int64_t V = 1000, rows = 512, launches = 8;
  Rng rng(3);
  Tensor row = Tensor::empty({V}, DType::F32);
  rng.fill_normal(row, 0.0, 2.0);
  Tensor row16 = row.to(DType::BF16).to(DType::F32);  // the values the GPU sees (ties included)
  Tensor logits = Tensor::empty({rows, V}, DType::F32);
  for (int64_t b = 0; b < rows; ++b)
    for (int64_t i = 0; i < V; ++i) logits.data<float>()[b * V + i] = row16.data<float>()[i];
  Tensor logits_dev = gpu_testing::to_device(logits, DType::BF16);
  struct Opt {
    double temperature;
    int64_t top_k;
    double top_p;
  };
  for (const Opt& o : {Opt{0.8, 50, 0.95}, Opt{1.0, 0, 0.9}, Opt{1.3, 7, 1.0}, Opt{0.5, 0, 1.0}}) {
    infer::SamplerOptions so;
    so.temperature = o.temperature;
    so.top_k = o.top_k;
    so.top_p = o.top_p;
    const std::vector<double> want = infer::Sampler(so).distribution(row16.data<float>(), V);
    std::vector<uint64_t> seeds(rows);
    for (int64_t b = 0; b < rows; ++b) seeds[b] = 1000 + b;
    Tensor seeds_dev = Tensor::empty({rows}, DType::F64, Device::CUDA);
    QV_CUDA_CHECK(cudaMemcpy(seeds_dev.raw(), seeds.data(), 8 * rows, cudaMemcpyHostToDevice));
    Tensor tokens_dev = Tensor::empty({rows}, DType::F32, Device::CUDA);
    Tensor pos_dev = Tensor::empty({1}, DType::F32, Device::CUDA);
    std::vector<double> seen(V, 0.0);
    for (int32_t l = 0; l < launches; ++l) {
      QV_CUDA_CHECK(cudaMemcpy(pos_dev.raw(), &l, sizeof(int32_t), cudaMemcpyHostToDevice));
      cuda::sample_tokens(logits_dev, so, static_cast<const uint64_t*>(seeds_dev.raw()),
                          static_cast<const int32_t*>(pos_dev.raw()), 0, static_cast<int32_t*>(tokens_dev.raw()),
                          nullptr, 0);
      std::vector<int32_t> got(rows);
      QV_CUDA_CHECK(cudaMemcpy(got.data(), tokens_dev.raw(), 4 * rows, cudaMemcpyDeviceToHost));
      for (int32_t id : got) {
        ASSERT_TRUE(id >= 0 && id < V);
        EXPECT_GT(want[id], 0.0) << "token " << id << " is outside the kept set";
        seen[id] += 1.0 / double(rows * launches);
      }
    }
    double tv = 0;
    for (int64_t i = 0; i < V; ++i) tv += 0.5 * std::fabs(seen[i] - want[i]);
    // With n = 4096 draws over k kept tokens, E[TV] ≈ ½ Σ √(p_i/n) ≤ ½ √(k/n); 0.15 is far above
    // that for the sets here (k ≤ ~60 effective tokens) and far below a wrong distribution's.
    EXPECT_LT(tv, 0.15) << "temperature " << o.temperature << " top_k " << o.top_k << " top_p " << o.top_p;
  }
  // Greedy: the lowest id among equal maxima.
  Tensor tie = Tensor::zeros({1, V}, DType::F32);
  tie.data<float>()[17] = 5.0f;
  tie.data<float>()[400] = 5.0f;
  Tensor tie_dev = gpu_testing::to_device(tie, DType::BF16);
  infer::SamplerOptions greedy;
  greedy.greedy = true;
  Tensor seed1 = Tensor::zeros({1}, DType::F64, Device::CUDA);
  Tensor pos1 = Tensor::zeros({1}, DType::F32, Device::CUDA);
  Tensor out1 = Tensor::zeros({1}, DType::F32, Device::CUDA);
  cuda::sample_tokens(tie_dev, greedy, static_cast<const uint64_t*>(seed1.raw()), static_cast<const int32_t*>(pos1.raw()),
                      0, static_cast<int32_t*>(out1.raw()), nullptr, 0);
  int32_t id = -1;
  QV_CUDA_CHECK(cudaMemcpy(&id, out1.raw(), 4, cudaMemcpyDeviceToHost));
  EXPECT_EQ(id, 17);
}

// The top-k fast path (candidates above a bound, sorted in shared memory) and the radix path
// keep the same set and draw the same token: with top_k ≥ V both keep every token, so the
// draws must agree bit for bit, for odd V (rows that start off 16-byte alignment) and ties.
std::vector<int32_t> draw(const Tensor& logits_dev, const infer::SamplerOptions& so, int64_t rows, int32_t pos) {
  std::vector<uint64_t> seeds(rows);
  for (int64_t b = 0; b < rows; ++b) seeds[b] = 77 + 3 * b;
  Tensor seeds_dev = Tensor::empty({rows}, DType::F64, Device::CUDA);
  QV_CUDA_CHECK(cudaMemcpy(seeds_dev.raw(), seeds.data(), 8 * rows, cudaMemcpyHostToDevice));
  Tensor pos_dev = Tensor::empty({1}, DType::F32, Device::CUDA);
  QV_CUDA_CHECK(cudaMemcpy(pos_dev.raw(), &pos, sizeof(int32_t), cudaMemcpyHostToDevice));
  Tensor out = Tensor::empty({rows}, DType::F32, Device::CUDA);
  cuda::sample_tokens(logits_dev, so, static_cast<const uint64_t*>(seeds_dev.raw()),
                      static_cast<const int32_t*>(pos_dev.raw()), 0, static_cast<int32_t*>(out.raw()), nullptr, 0);
  std::vector<int32_t> got(rows);
  QV_CUDA_CHECK(cudaMemcpy(got.data(), out.raw(), 4 * rows, cudaMemcpyDeviceToHost));
  return got;
}

TEST(GpuSampler, TopKFastPathEqualsTheRadixPath) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (int64_t V : {1000, 1001, 1024}) {
    const int64_t rows = 64;
    Rng rng(V);
    Tensor logits = Tensor::empty({rows, V}, DType::F32);
    rng.fill_normal(logits, 0.0, 1.5);
    for (int64_t i = 0; i < rows * V; i += 7) logits.data<float>()[i] = 1.0f;  // ties
    Tensor dev = gpu_testing::to_device(logits, DType::BF16);
    for (double top_p : {1.0, 0.9, 0.5})
      for (double temperature : {0.7, 1.3}) {
        infer::SamplerOptions all, fast;
        all.temperature = fast.temperature = temperature;
        all.top_p = fast.top_p = top_p;
        all.top_k = 0;     // the radix path
        fast.top_k = V;    // the fast path (top_k ≤ 1024), keeping every token too
        for (int32_t pos = 0; pos < 4; ++pos)
          EXPECT_EQ(draw(dev, fast, rows, pos), draw(dev, all, rows, pos))
              << "V " << V << " top_p " << top_p << " temperature " << temperature << " pos " << pos;
      }
  }
}

// Equal logits everywhere: the top-k set is the first k ids (ties in id order), and the
// nucleus the first half of them; with V = 50,257 the candidates overflow the fast path's
// list and the radix path answers, with V = 3,000 the fast path does.
TEST(GpuSampler, TiesKeepTheLowestIds) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (int64_t V : {3000, 50257}) {
    const int64_t rows = 256;
    Tensor dev = gpu_testing::to_device(Tensor::zeros({rows, V}, DType::F32), DType::BF16);
    infer::SamplerOptions so;
    so.temperature = 1.0;
    so.top_k = 50;
    for (double top_p : {1.0, 0.5}) {
      so.top_p = top_p;
      std::vector<int> seen(50, 0);
      for (int32_t pos = 0; pos < 4; ++pos)
        for (int32_t id : draw(dev, so, rows, pos)) {
          ASSERT_TRUE(id >= 0 && id < (top_p < 1 ? 25 : 50)) << "V " << V << " top_p " << top_p << " id " << id;
          ++seen[id];
        }
      int distinct = 0;
      for (int c : seen) distinct += c > 0;
      EXPECT_GT(distinct, top_p < 1 ? 20 : 40) << "V " << V << ": draws should spread over the kept ids";
    }
  }
}

// Graph replay draws the same tokens as launching every kernel, for a dense and an algebraic
// (one graph per row type) model; greedy tokens are the argmax of the full forward.
TEST(GpuGenerate, GraphReplayEqualsEagerSteps) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (const nlohmann::json& ov : {nlohmann::json::object(),
                                   nlohmann::json{{"ffn", {{"law", "Q2xQ2"}, {"schedule", "interval:16"}}}}}) {
    const model::ModelConfig cfg = small_config("AFL", ov);
    model::Model cpu(cfg, DType::F32);
    randomize(cpu, 13);
    cuda::GpuModel gpu(cfg);
    gpu.load_params(cpu.params());
    const std::vector<std::vector<int32_t>> prompts = {random_ids(5, cfg.vocab_size, 1), random_ids(5, cfg.vocab_size, 2)};
    for (bool greedy : {false, true}) {
      infer::SamplerOptions so;
      so.temperature = 0.8;
      so.top_k = 20;
      so.top_p = 0.95;
      so.greedy = greedy;
      std::vector<infer::Sampler> samplers;
      for (int i = 0; i < 2; ++i) {
        so.seed = 40 + i;
        samplers.emplace_back(so);
      }
      cuda::GpuGenerateOptions eager;
      eager.graphs = false;
      const auto a = cuda::generate_tokens(gpu, prompts, 60, samplers, {}, {}, nullptr, {});
      const auto b = cuda::generate_tokens(gpu, prompts, 60, samplers, {}, {}, nullptr, eager);
      for (size_t r = 0; r < prompts.size(); ++r) {
        ASSERT_EQ(a[r].tokens.size(), 60u);
        EXPECT_EQ(a[r].tokens, b[r].tokens) << "row " << r << (greedy ? " greedy" : " sampled");
      }
      if (greedy) {
        std::vector<int32_t> seq = prompts[0];
        seq.insert(seq.end(), a[0].tokens.begin(), a[0].tokens.end() - 1);
        const int64_t T = static_cast<int64_t>(seq.size()), V = cfg.vocab_size;
        const Tensor full = gpu.forward_logits(seq.data(), 1, T);
        for (int64_t i = 0; i < 60; ++i) {
          const float* l = full.data<float>() + (prompts[0].size() - 1 + i) * V;
          const float best = *std::max_element(l, l + V);
          // Equal up to bf16 near-ties between the two paths.
          EXPECT_GE(l[a[0].tokens[i]], best - 0.05f) << "step " << i;
        }
      }
    }
  }
}

// Kernels of one decode step of alg110m-dense (its shapes; zero parameters, which the count
// does not depend on), counted in the captured graph of the step, and the step's time under
// graph replay, printed for batch 1 and 32. q/k/v and gate/up are one GEMM each, so a layer
// is at most 9 kernels: norm, q/k/v, attention, W_O (+ residual), norm, gate/up, SwiGLU, down
// (+ residual), and one spare for a GEMM that cuBLASLt splits.
TEST(GpuDecode, KernelsPerStepOfAlg110mDense) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const nlohmann::json j = {{"name", "alg110m-dense"}, {"vocab_size", 50257}, {"context", 1536}, {"d_model", 768},
                            {"n_heads", 32}, {"n_layers", 12}, {"pattern", "AAAAAAAAAAAA"},
                            {"ffn", {{"kind", "swiglu"}, {"width", 1536}, {"law", "dense"}, {"bias", false}}},
                            {"norm", "layernorm"}, {"positions", "learned"}, {"attn_bias", true},
                            {"tied_head", true}};
  const model::ModelConfig cfg = model::config_from_json(j);
  cuda::GpuModel gpu(cfg);
  const cudaStream_t stream = gpu.stream();
  for (int64_t B : {1, 32}) {
    auto state = gpu.new_decode_state(B, 128);
    const std::vector<int32_t> prompt(static_cast<size_t>(B * 4), 1);
    gpu.prefill(*state, prompt.data(), B, 4);
    gpu.decode_step(*state);  // warms the plans of the step's shapes
    QV_CUDA_CHECK(cudaStreamSynchronize(stream));
    cudaGraph_t graph = nullptr;
    QV_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    gpu.decode_step(*state);
    QV_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    size_t count = 0;
    QV_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &count));
    std::vector<cudaGraphNode_t> nodes(count);
    QV_CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &count));
    int64_t kernels = 0;
    for (cudaGraphNode_t node : nodes) {
      cudaGraphNodeType type;
      QV_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
      if (type == cudaGraphNodeTypeKernel) ++kernels;
    }
    cudaGraphExec_t exec = nullptr;
    QV_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    QV_CUDA_CHECK(cudaGraphDestroy(graph));
    QV_CUDA_CHECK(cudaGraphLaunch(exec, stream));  // the captured step itself
    const int steps = 100;
    cudaEvent_t start, stop;
    QV_CUDA_CHECK(cudaEventCreate(&start));
    QV_CUDA_CHECK(cudaEventCreate(&stop));
    QV_CUDA_CHECK(cudaEventRecord(start, stream));
    for (int i = 0; i < steps; ++i) {
      state->count_replayed_step();
      QV_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    }
    QV_CUDA_CHECK(cudaEventRecord(stop, stream));
    QV_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    QV_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    std::printf("alg110m-dense decode step, batch %lld: %lld graph nodes, %lld kernels, %.1f us per step (graph replay, no sampling)\n",
                static_cast<long long>(B), static_cast<long long>(count), static_cast<long long>(kernels),
                1000.0 * ms / steps);
    QV_CUDA_CHECK(cudaEventDestroy(start));
    QV_CUDA_CHECK(cudaEventDestroy(stop));
    QV_CUDA_CHECK(cudaGraphExecDestroy(exec));
    EXPECT_LE(kernels, 9 * cfg.n_layers + 6) << "batch " << B;
  }
}

}  // namespace

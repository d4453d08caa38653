// The decoder LM on the CPU (F64): whole-model finite-difference gradients for every mixer,
// FFN law and kind, norm and position kind, and the ablations; the loss and gradient
// contracts; decoding with caches against the full forward; initialization.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "algebra/law.h"
#include "model/config.h"
#include "model/model.h"
#include "ops/algproj.h"
#include "ops/attention.h"
#include "ops/givens.h"
#include "ops/linear_relation.h"
#include "ops/relation.h"
#include "quiver/rng.h"
#include "testing.h"

using namespace quiver;
using namespace quiver::model;

namespace {

// vocab 11, ctx 8, d 8, 2 heads of 4, 2 layers; `edit` adjusts the JSON.
ModelConfig tiny_config(const std::string& pattern, const nlohmann::json& overrides = nlohmann::json::object()) {
  nlohmann::json j = {{"name", "test"}, {"vocab_size", 11}, {"context", 8}, {"d_model", 8}, {"n_heads", 2},
                      {"n_layers", static_cast<int64_t>(pattern.size())}, {"pattern", pattern},
                      {"ffn", {{"kind", "swiglu"}, {"width", 8}}}, {"init_std", 0.5}};
  for (auto& [key, value] : overrides.items()) {
    if (value.is_object() && j.contains(key))
      for (auto& [k2, v2] : value.items()) j[key][k2] = v2;
    else
      j[key] = value;
  }
  return config_from_json(j);
}

// Initializes, then moves every parameter off its special initial value (norm weights 1,
// biases 0, θ 0) so that every path carries gradient.
void randomize(Model& m, uint64_t seed) {
  m.init(seed);
  Rng rng(seed + 1);
  Tensor noise = quiver::testing::random_tensor({m.num_params()}, DType::F64, rng, 0.15);
  const double* n = noise.data<double>();
  double* p = m.params().data<double>();
  for (int64_t i = 0; i < m.num_params(); ++i) p[i] += n[i];
}

struct Batch {
  std::vector<int32_t> tokens, targets;
};

Batch random_batch(int64_t B, int64_t T, int64_t V, uint64_t seed, bool with_ignored = false) {
  Rng rng(seed);
  Batch b;
  for (int64_t i = 0; i < B * T; ++i) {
    b.tokens.push_back(static_cast<int32_t>(rng.below(V)));
    b.targets.push_back(static_cast<int32_t>(rng.below(V)));
  }
  if (with_ignored) b.targets[1] = -1;
  return b;
}

// Checks dLoss/dθ of every parameter tensor against central differences of forward_loss.
void check_gradients(const ModelConfig& cfg, double tolerance = 1e-6) {
  Model m(cfg, DType::F64);
  randomize(m, 7);
  const int64_t B = 2, T = 5;
  Batch batch = random_batch(B, T, cfg.vocab_size, 3, true);
  m.grads().fill(0.0);
  const double loss = m.forward_backward(batch.tokens.data(), batch.targets.data(), B, T, 1.0f);
  ASSERT_TRUE(std::isfinite(loss));
  auto loss_fn = [&] { return m.forward_loss(batch.tokens.data(), batch.targets.data(), B, T); };
  for (const ParamInfo& info : m.param_table()) {
    SCOPED_TRACE(info.name);
    Tensor param = m.param(info.name);
    Tensor grad = m.grad(info.name);
    if (!info.trainable) {
      EXPECT_EQ(norm2(grad), 0.0) << "a frozen parameter received a gradient";
      continue;
    }
    EXPECT_GT(norm2(grad), 0.0) << "no gradient reached this tensor";
    double err = quiver::testing::finite_difference_error(loss_fn, param, grad, 1e-6, 24);
    EXPECT_LT(err, tolerance);
  }
}

}  // namespace

// ---- an independent forward: plain loops and the ops' reference twins, one sequence at a time ----

namespace {

using Mat = Tensor;  // F64 [rows, cols]

Mat matmul(const Mat& x, const Tensor& w, const Tensor& b = Tensor()) {
  const int64_t M = x.dim(0), K = x.dim(1), N = w.dim(1);
  Mat y = Tensor::zeros({M, N}, DType::F64);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double s = b.defined() ? b.at({n}) : 0.0;
      for (int64_t k = 0; k < K; ++k) s += x.at({m, k}) * w.at({k, n});
      y.data<double>()[m * N + n] = s;
    }
  return y;
}

Mat normalize(const ModelConfig& c, const Mat& x, const Tensor& w, const Tensor& b) {
  const int64_t M = x.dim(0), D = x.dim(1);
  Mat y = Tensor::zeros({M, D}, DType::F64);
  for (int64_t m = 0; m < M; ++m) {
    double mean = 0, sq = 0;
    if (c.norm == "layernorm")
      for (int64_t d = 0; d < D; ++d) mean += x.at({m, d}) / D;
    for (int64_t d = 0; d < D; ++d) sq += (x.at({m, d}) - mean) * (x.at({m, d}) - mean) / D;
    for (int64_t d = 0; d < D; ++d)
      y.data<double>()[m * D + d] =
          (x.at({m, d}) - mean) / std::sqrt(sq + c.norm_eps) * w.at({d}) + (b.defined() ? b.at({d}) : 0.0);
  }
  return y;
}

// RoPE (rotate-half pairs (i, i + Dh/2), angle p · base^(−2i/Dh)) on x [T, H·Dh], positions from 0.
void rotate(const ModelConfig& c, Mat& x) {
  const int64_t T = x.dim(0), H = c.n_heads, Dh = x.dim(1) / H;
  double* p = x.data<double>();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < Dh / 2; ++i) {
        const double angle = t * std::pow(c.rope_base, -2.0 * i / Dh);
        double& a = p[t * H * Dh + h * Dh + i];
        double& b = p[t * H * Dh + h * Dh + i + Dh / 2];
        const double a0 = a, b0 = b;
        a = a0 * std::cos(angle) - b0 * std::sin(angle);
        b = a0 * std::sin(angle) + b0 * std::cos(angle);
      }
}

Mat sublayer_ffn(const ModelConfig& c, const Model& m, const std::string& p, const Mat& h) {
  const int64_t T = h.dim(0), F = c.ffn.width;
  auto project = [&](const Mat& x, const std::string& name, bool to_f) {
    const std::string bias = p + "ffn." + name + "_bias";
    if (c.ffn.law == "dense") return matmul(x, m.param(p + "ffn." + name), c.ffn.bias ? m.param(bias) : Tensor());
    algebra::Law law = algebra::Law::parse(c.ffn.law);
    const int q = law.q();
    std::vector<int64_t> dg(q, c.d_model / q), fg(q, F / q);
    if (!c.ffn.d_groups.empty()) dg = c.ffn.d_groups;
    if (!c.ffn.f_groups.empty()) fg = c.ffn.f_groups;
    algebra::GroupWidths widths{to_f ? dg : fg, to_f ? fg : dg};
    std::vector<int> types = algebra::Schedule::parse(c.ffn.schedule).types(0, T, q);
    Tensor y = Tensor::empty({T, to_f ? F : c.d_model}, DType::F64);
    ops::algproj_reference_forward(x, m.param(p + "ffn." + name), law, widths, types, y);
    return y;
  };
  Mat act;
  if (c.ffn.kind == "swiglu") {
    Mat g = project(h, "gate", true), u = project(h, "up", true);
    act = Tensor::empty({T, F}, DType::F64);
    for (int64_t i = 0; i < T * F; ++i) {
      const double z = g.data<double>()[i];
      act.data<double>()[i] = z / (1 + std::exp(-z)) * u.data<double>()[i];
    }
  } else {
    act = project(h, "up", true);
    for (int64_t i = 0; i < T * F; ++i) {
      double& z = act.data<double>()[i];
      z = 0.5 * z * (1 + std::tanh(std::sqrt(2 / M_PI) * (z + 0.044715 * z * z * z)));
    }
  }
  return project(act, "down", false);
}

Mat sublayer_mixer(const ModelConfig& c, const Model& m, int64_t layer, const Mat& h) {
  const std::string p = "layers." + std::to_string(layer) + ".mixer.";
  const int64_t T = h.dim(0), H = c.n_heads, Dh = c.head_dim(), D = c.d_model;
  auto bias = [&](const char* name) { return c.attn_bias ? m.param(p + name) : Tensor(); };
  const bool rope = c.positions == "rope";
  Mat y = Tensor::empty({T, D}, DType::F64);
  const char kind = c.pattern[layer];
  if (kind == 'A') {
    const int64_t Hkv = c.kv_heads();
    Mat q = matmul(h, m.param(p + "wq"), bias("bq")), k = matmul(h, m.param(p + "wk"), bias("bk"));
    Mat v = matmul(h, m.param(p + "wv"), bias("bv"));
    if (rope) {
      rotate(c, q);
      ModelConfig kv_cfg = c;
      kv_cfg.n_heads = Hkv;
      rotate(kv_cfg, k);
    }
    Tensor y3 = y.reshape({T, H, Dh});
    ops::attention_reference_forward(q.reshape({T, H, Dh}), k.reshape({T, Hkv, Dh}), v.reshape({T, Hkv, Dh}), y3);
  } else {
    Mat p1 = matmul(h, m.param(p + "w1"), bias("b1")), p2 = matmul(h, m.param(p + "w2"), bias("b2"));
    Mat I = c.relation.raw_x ? h.clone() : matmul(h, m.param(p + "wi"), bias("bi"));
    if (rope) {
      rotate(c, p1);
      rotate(c, p2);
    }
    Mat mixed = I.clone();
    if (c.relation.givens && H > 1) {
      Tensor theta = m.param(p + "theta");
      auto pairs = ops::givens_pairs(H, layer);
      for (int64_t t = 0; t < T; ++t)
        for (size_t k = 0; k < pairs.size(); ++k)
          for (int64_t d = 0; d < Dh; ++d) {
            const double a = I.at({t, pairs[k].first * Dh + d}), b = I.at({t, pairs[k].second * Dh + d});
            const double th = theta.at({static_cast<int64_t>(k)});
            mixed.data<double>()[t * D + pairs[k].first * Dh + d] = std::cos(th) * a - std::sin(th) * b;
            mixed.data<double>()[t * D + pairs[k].second * Dh + d] = std::sin(th) * a + std::cos(th) * b;
          }
    }
    Tensor y3 = y.reshape({T, H, Dh});
    if (kind == 'F') {
      ops::RelationOptions options;
      options.tau_s = c.relation.tau_s;
      options.exchange_only = c.relation.exchange_only;
      ops::relation_reference_forward(p1.reshape({T, H, Dh}), p2.reshape({T, H, Dh}), mixed.reshape({T, H, Dh}),
                                      m.param(p + "lambda").at({0}), y3, options);
    } else {
      Mat r = matmul(matmul(h, m.param(p + "w_alpha_down")), m.param(p + "w_alpha_up"));
      Mat g = Tensor::empty({T, D}, DType::F64);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t j = 0; j < D; ++j) {
          const double z = r.at({t, j}) + m.param(p + "dt_bias").at({j});
          g.data<double>()[t * D + j] = -std::exp(m.param(p + "a_log").at({j / Dh})) * std::log1p(std::exp(z));
        }
      ops::linear_relation_recurrent_forward(p1.reshape({T, H, Dh}), p2.reshape({T, H, Dh}),
                                             mixed.reshape({T, H, Dh}), g.reshape({T, H, Dh}), y3,
                                             c.relation.tau_s);
    }
  }
  return matmul(y, m.param(p + "wo"), bias("bo"));
}

// logits [T, V] of one sequence.
Mat reference_logits(const Model& m, const int32_t* tokens, int64_t T) {
  const ModelConfig& c = m.config();
  const int64_t D = c.d_model;
  auto norm_bias = [&](const std::string& name) { return c.norm == "layernorm" ? m.param(name) : Tensor(); };
  Mat x = Tensor::empty({T, D}, DType::F64);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t d = 0; d < D; ++d)
      x.data<double>()[t * D + d] =
          m.param("tok_emb").at({tokens[t], d}) + (c.positions == "learned" ? m.param("pos_emb").at({t, d}) : 0.0);
  auto add = [](Mat& a, const Mat& b) {
    for (int64_t i = 0; i < a.numel(); ++i) a.data<double>()[i] += b.data<double>()[i];
  };
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    add(x, sublayer_mixer(c, m, l, normalize(c, x, m.param(p + "norm1.weight"), norm_bias(p + "norm1.bias"))));
    add(x, sublayer_ffn(c, m, p, normalize(c, x, m.param(p + "norm2.weight"), norm_bias(p + "norm2.bias"))));
  }
  Mat hf = normalize(c, x, m.param("norm_f.weight"), norm_bias("norm_f.bias"));
  if (!c.tied_head) return matmul(hf, m.param("head"));
  return matmul(hf, m.param("tok_emb").transpose(0, 1).clone());
}

void check_against_reference(const ModelConfig& cfg) {
  Model m(cfg, DType::F64);
  randomize(m, 13);
  const int64_t B = 2, T = cfg.context, V = cfg.vocab_size;
  Batch batch = random_batch(B, T, V, 6);
  Tensor logits;
  m.forward_logits(batch.tokens.data(), B, T, logits);
  for (int64_t b = 0; b < B; ++b) {
    Mat ref = reference_logits(m, batch.tokens.data() + b * T, T);
    Tensor got = logits.slice(0, b, b + 1).reshape({T, V});
    EXPECT_LT(rel_error(got, ref), 1e-12) << "sequence " << b;
  }
}

}  // namespace

TEST(Model, ForwardMatchesIndependentReference) {
  const nlohmann::json interval = {{"ffn", {{"law", "Q2xQ2"}, {"schedule", "interval:8"}}}};
  check_against_reference(tiny_config("AFL", interval));
  check_against_reference(tiny_config("LA", {{"norm", "layernorm"},
                                             {"positions", "learned"},
                                             {"attn_bias", true},
                                             {"tied_head", false},
                                             {"n_kv_heads", 1},
                                             {"ffn", {{"kind", "gelu"}, {"bias", true}}}}));
  check_against_reference(tiny_config(
      "FL", {{"attn_bias", true},
             {"ffn", {{"law", "Q2"}, {"d_groups", {3, 5}}, {"f_groups", {6, 2}}}},
             {"relation", {{"tau_s", 1.5}, {"raw_x", true}}}}));
  check_against_reference(tiny_config("FF", {{"relation", {{"exchange_only", true}, {"givens", false}}}}));
}

TEST(ModelGradients, AttentionDenseLayerNormLearnedBiasesUntiedGqa) {
  check_gradients(tiny_config("AA", {{"norm", "layernorm"},
                                     {"positions", "learned"},
                                     {"attn_bias", true},
                                     {"tied_head", false},
                                     {"n_kv_heads", 1},
                                     {"ffn", {{"bias", true}}}}));
}

TEST(ModelGradients, FullRelationQ2GeluCyclic) {
  check_gradients(tiny_config("FF", {{"attn_bias", true}, {"ffn", {{"kind", "gelu"}, {"law", "Q2"}}}}));
}

TEST(ModelGradients, LinearRelationQ2x2Interval) {
  check_gradients(tiny_config("LL", {{"ffn", {{"law", "Q2xQ2"}, {"schedule", "interval:4"}}}}));
}

TEST(ModelGradients, HybridAttentionFullRelationLayerNorm) {
  check_gradients(tiny_config("AF", {{"norm", "layernorm"}, {"ffn", {{"law", "Q2xQ2"}, {"schedule", "cyclic"}}}}));
}

TEST(ModelGradients, HybridLinearFullLearnedGeluDenseBias) {
  check_gradients(tiny_config(
      "LF", {{"positions", "learned"}, {"attn_bias", true}, {"ffn", {{"kind", "gelu"}, {"bias", true}}}}));
}

TEST(ModelGradients, RelationAblations) {
  // exchange-only transport, raw-X communication, no Givens mixing, λ frozen at 0.
  check_gradients(tiny_config("FF", {{"relation",
                                      {{"exchange_only", true},
                                       {"raw_x", true},
                                       {"givens", false},
                                       {"lambda_init", 0.0},
                                       {"lambda_frozen", true}}}}));
  // Single head (H = 1: Givens has no pair) with raw_x in a Linear Relation layer.
  check_gradients(tiny_config("LF", {{"n_heads", 1}, {"relation", {{"raw_x", true}}}}));
}

TEST(Model, ForwardLossMatchesForwardBackwardAndGradsAccumulate) {
  ModelConfig cfg = tiny_config("LF", {{"ffn", {{"law", "Q2xQ2"}, {"schedule", "interval:4"}}}});
  Model m(cfg, DType::F64);
  randomize(m, 11);
  const int64_t B = 3, T = 6;
  Batch batch = random_batch(B, T, cfg.vocab_size, 5);
  m.grads().fill(0.0);
  const double loss = m.forward_backward(batch.tokens.data(), batch.targets.data(), B, T, 1.0f);
  EXPECT_NEAR(loss, m.forward_loss(batch.tokens.data(), batch.targets.data(), B, T), 1e-12 * std::abs(loss));
  Tensor once = m.grads().clone();
  m.forward_backward(batch.tokens.data(), batch.targets.data(), B, T, 1.0f);
  Tensor twice = m.grads().clone();
  Tensor doubled = once.clone();
  for (int64_t i = 0; i < doubled.numel(); ++i) doubled.data<double>()[i] *= 2.0;
  EXPECT_LT(rel_error(twice, doubled), 1e-12);
  // grad_scale scales what is added.
  m.grads().fill(0.0);
  m.forward_backward(batch.tokens.data(), batch.targets.data(), B, T, 0.25f);
  Tensor quarter = once.clone();
  for (int64_t i = 0; i < quarter.numel(); ++i) quarter.data<double>()[i] *= 0.25;
  EXPECT_LT(rel_error(m.grads(), quarter), 1e-12);

  // The loss is the mean cross-entropy of forward_logits.
  Tensor logits;
  m.forward_logits(batch.tokens.data(), B, T, logits);
  double expected = 0;
  for (int64_t r = 0; r < B * T; ++r) {
    const double* row = logits.data<double>() + r * cfg.vocab_size;
    double mx = row[0], sum = 0;
    for (int64_t v = 1; v < cfg.vocab_size; ++v) mx = std::max(mx, row[v]);
    for (int64_t v = 0; v < cfg.vocab_size; ++v) sum += std::exp(row[v] - mx);
    expected += mx + std::log(sum) - row[batch.targets[r]];
  }
  EXPECT_NEAR(loss, expected / (B * T), 1e-12 * std::abs(loss));

  // A shape change in between does not disturb the results.
  Batch other = random_batch(1, 4, cfg.vocab_size, 9);
  m.forward_loss(other.tokens.data(), other.targets.data(), 1, 4);
  EXPECT_NEAR(loss, m.forward_loss(batch.tokens.data(), batch.targets.data(), B, T), 1e-12 * std::abs(loss));
}

TEST(Model, Float32MatchesFloat64) {
  ModelConfig cfg = tiny_config("LFA", {{"ffn", {{"law", "Q2xQ2"}}}});
  Model m64(cfg, DType::F64), m32(cfg, DType::F32);
  randomize(m64, 5);
  m32.params().copy_from(m64.params());
  Batch batch = random_batch(2, 7, cfg.vocab_size, 4);
  m64.grads().fill(0.0);
  m32.grads().fill(0.0);
  double l64 = m64.forward_backward(batch.tokens.data(), batch.targets.data(), 2, 7, 1.0f);
  double l32 = m32.forward_backward(batch.tokens.data(), batch.targets.data(), 2, 7, 1.0f);
  EXPECT_NEAR(l32, l64, 1e-5 * l64);
  EXPECT_LT(rel_error(m32.grads(), m64.grads()), 1e-4);
}

// Prefill of a prompt, then decode steps: the logits at every position equal those of the full
// forward (row types of the interval schedule continue across prefill and decoding).
void check_decode(const ModelConfig& cfg, int64_t prompt) {
  Model m(cfg, DType::F64);
  randomize(m, 21);
  const int64_t B = 2, T = cfg.context, V = cfg.vocab_size;
  Batch batch = random_batch(B, T, V, 8);
  Tensor full;
  m.forward_logits(batch.tokens.data(), B, T, full);

  auto expect_position = [&](const Tensor& logits, int64_t t) {
    Tensor ref = Tensor::empty({B, V}, DType::F64);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t v = 0; v < V; ++v) ref.data<double>()[b * V + v] = full.data<double>()[(b * T + t) * V + v];
    EXPECT_LT(rel_error(logits, ref), 1e-11) << "position " << t;
  };

  std::unique_ptr<DecodeState> s = m.new_decode_state(B, T);
  std::vector<int32_t> prompt_tokens;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < prompt; ++t) prompt_tokens.push_back(batch.tokens[b * T + t]);
  Tensor logits;
  m.prefill(*s, prompt_tokens.data(), B, prompt, logits);
  EXPECT_EQ(m.position(*s), prompt);
  expect_position(logits, prompt - 1);
  for (int64_t t = prompt; t < T; ++t) {
    int32_t column[B] = {batch.tokens[t], batch.tokens[T + t]};
    m.decode_step(*s, column, logits);
    expect_position(logits, t);
  }
  EXPECT_EQ(m.position(*s), T);
  EXPECT_THROW(m.decode_step(*s, batch.tokens.data(), logits), Error);

  // A prefill that continues a started sequence gives the same logits.
  std::unique_ptr<DecodeState> s2 = m.new_decode_state(B, T);
  std::vector<int32_t> first, rest;
  for (int64_t b = 0; b < B; ++b) {
    first.push_back(batch.tokens[b * T]);
    for (int64_t t = 1; t < 4; ++t) rest.push_back(batch.tokens[b * T + t]);
  }
  m.prefill(*s2, first.data(), B, 1, logits);
  expect_position(logits, 0);
  m.prefill(*s2, rest.data(), B, 3, logits);
  expect_position(logits, 3);
}

TEST(ModelDecode, MatchesFullForwardForEachMixer) {
  const nlohmann::json algebraic = {{"ffn", {{"law", "Q2xQ2"}, {"schedule", "interval:8"}}}};
  for (const char* pattern : {"AA", "FF", "LL", "LFA"}) {
    SCOPED_TRACE(pattern);
    check_decode(tiny_config(pattern, algebraic), 3);
  }
  check_decode(tiny_config("AF", {{"positions", "learned"}, {"norm", "layernorm"}, {"attn_bias", true},
                                  {"tied_head", false}, {"ffn", {{"law", "Q2"}, {"schedule", "cyclic"}}}}),
               5);
  check_decode(tiny_config("AA", {{"n_kv_heads", 1}}), 1);
  check_decode(tiny_config("FL", {{"relation", {{"exchange_only", false}, {"raw_x", true}, {"givens", false}}}}), 2);
  check_decode(tiny_config("FF", {{"relation", {{"exchange_only", true}}}}), 4);
}

TEST(ModelDecode, RejectsMisuse) {
  Model m(tiny_config("AF", {{"positions", "learned"}}), DType::F64);
  m.init(1);
  EXPECT_THROW(m.new_decode_state(1, 9), Error);  // beyond the learned positions
  std::unique_ptr<DecodeState> s = m.new_decode_state(2, 4);
  std::vector<int32_t> tokens(10, 1);
  Tensor logits;
  EXPECT_THROW(m.prefill(*s, tokens.data(), 1, 2, logits), Error);  // batch mismatch
  EXPECT_THROW(m.prefill(*s, tokens.data(), 2, 5, logits), Error);  // beyond capacity
  Model other(tiny_config("AF"), DType::F64);
  EXPECT_THROW(other.decode_step(*s, tokens.data(), logits), Error);
  std::vector<int32_t> bad = {1, 11};
  EXPECT_THROW(m.decode_step(*s, bad.data(), logits), Error);  // token outside the vocabulary
}

TEST(Model, InitIsDeterministicAndScaled) {
  ModelConfig cfg = config_from_json(nlohmann::json::parse(R"({
    "vocab_size": 64, "context": 16, "d_model": 64, "n_heads": 4, "n_layers": 2, "pattern": "LF",
    "ffn": {"width": 128}, "relation": {"lambda_init": 0.25}, "init_std": 0.05})"));
  Model a(cfg), b(cfg), c(cfg);
  a.init(3);
  b.init(3);
  c.init(4);
  EXPECT_EQ(rel_error(a.params(), b.params()), 0.0);
  EXPECT_GT(rel_error(a.params(), c.params()), 0.1);

  auto stddev = [](const Tensor& t) {
    Tensor d = t.to(DType::F64);
    double s = 0;
    for (int64_t i = 0; i < d.numel(); ++i) s += d.data<double>()[i] * d.data<double>()[i];
    return std::sqrt(s / d.numel());
  };
  EXPECT_NEAR(stddev(a.param("tok_emb")), 0.05, 0.005);
  EXPECT_NEAR(stddev(a.param("layers.0.mixer.w1")), 0.05, 0.005);
  EXPECT_NEAR(stddev(a.param("layers.0.ffn.gate")), 0.05, 0.005);
  EXPECT_NEAR(stddev(a.param("layers.1.mixer.wo")), 0.05 / 2.0, 0.0025);  // 1/sqrt(2·2 layers)
  EXPECT_NEAR(stddev(a.param("layers.1.ffn.down")), 0.05 / 2.0, 0.0025);
  EXPECT_EQ(a.param("layers.1.norm2.weight").at({5}), 1.0);
  EXPECT_EQ(a.param("norm_f.weight").at({0}), 1.0);
  EXPECT_DOUBLE_EQ(a.param("layers.1.mixer.lambda").at({0}), 0.25);
  EXPECT_EQ(norm2(a.param("layers.0.mixer.theta")), 0.0);
  Tensor a_log = a.param("layers.0.mixer.a_log");
  for (int64_t h = 0; h < 4; ++h) {
    EXPECT_GE(a_log.at({h}), 0.0);
    EXPECT_LE(a_log.at({h}), std::log(16.0));
  }
  Tensor dt_bias = a.param("layers.0.mixer.dt_bias");
  for (int64_t i = 0; i < dt_bias.numel(); ++i) {
    double dt = std::log1p(std::exp(dt_bias.at({i})));  // softplus recovers dt
    EXPECT_GE(dt, 1e-3 * (1 - 1e-6));
    EXPECT_LE(dt, 1e-1 * (1 + 1e-6));
  }
}

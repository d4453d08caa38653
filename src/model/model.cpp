#include "model/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include "algebra/law.h"
#include "core/blas.h"
#include "model/layer_params.h"
#include "ops/activation.h"
#include "ops/algproj.h"
#include "ops/attention.h"
#include "ops/cross_entropy.h"
#include "ops/embedding.h"
#include "ops/givens.h"
#include "ops/linear.h"
#include "ops/linear_relation.h"
#include "ops/norm.h"
#include "ops/relation.h"
#include "ops/rope.h"
#include "quiver/error.h"
#include "quiver/rng.h"

namespace quiver::model {

namespace {

constexpr int64_t kLinearRelationChunk = 64;

template <typename Fn>
void dispatch(DType dtype, Fn&& fn) {
  if (dtype == DType::F32)
    fn(float{});
  else if (dtype == DType::F64)
    fn(double{});
  else
    fail("the CPU model computes in F32 or F64, got {}", dtype_name(dtype));
}

// dst += src (same element count, contiguous, one dtype).
void add_into(const Tensor& dst, const Tensor& src) {
  QV_CHECK(dst.numel() == src.numel(), "add_into: {} vs {} elements", dst.numel(), src.numel());
  dispatch(dst.dtype(), [&](auto zero) {
    using T = decltype(zero);
    T* d = dst.data<T>();
    const T* s = src.data<T>();
    for (int64_t i = 0, n = dst.numel(); i < n; ++i) d[i] += s[i];
  });
}

// c = op(a) op(b) + beta c for 2-D contiguous tensors (row-major), through OpenBLAS.
void matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c, double beta) {
  int64_t M = trans_a ? a.dim(1) : a.dim(0), K = trans_a ? a.dim(0) : a.dim(1);
  int64_t N = trans_b ? b.dim(0) : b.dim(1);
  QV_CHECK((trans_b ? b.dim(1) : b.dim(0)) == K && c.dim(0) == M && c.dim(1) == N,
           "matmul: shapes {}{} · {}{} → {}", shape_str(a.shape()), trans_a ? "ᵀ" : "", shape_str(b.shape()),
           trans_b ? "ᵀ" : "", shape_str(c.shape()));
  dispatch(a.dtype(), [&](auto zero) {
    using T = decltype(zero);
    blas::gemm(trans_a, trans_b, M, N, K, T(1), a.data<T>(), a.dim(1), b.data<T>(), b.dim(1), T(beta),
               c.data<T>(), c.dim(1));
  });
}

double read_scalar(const Tensor& t) {
  double v = 0;
  dispatch(t.dtype(), [&](auto zero) { v = static_cast<double>(t.data<decltype(zero)>()[0]); });
  return v;
}

void add_scalar(const Tensor& t, double value) {
  dispatch(t.dtype(), [&](auto zero) {
    using T = decltype(zero);
    t.data<T>()[0] += static_cast<T>(value);
  });
}

// x[b, t, :] += table[pos0 + t, :] for x [B, T, D] and table [rows, D].
void add_positions(const Tensor& x, const Tensor& table, int64_t B, int64_t T, int64_t pos0) {
  const int64_t D = table.dim(1);
  dispatch(x.dtype(), [&](auto zero) {
    using T_ = decltype(zero);
    T_* px = x.data<T_>();
    const T_* pt = table.data<T_>();
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t) {
        T_* row = px + (b * T + t) * D;
        const T_* src = pt + (pos0 + t) * D;
        for (int64_t d = 0; d < D; ++d) row[d] += src[d];
      }
  });
}

// dtable[t, :] += Σ_b dx[b, t, :].
void accumulate_positions(const Tensor& dx, const Tensor& dtable, int64_t B, int64_t T) {
  const int64_t D = dtable.dim(1);
  dispatch(dx.dtype(), [&](auto zero) {
    using T_ = decltype(zero);
    const T_* px = dx.data<T_>();
    T_* pt = dtable.data<T_>();
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t) {
        const T_* row = px + (b * T + t) * D;
        T_* dst = pt + t * D;
        for (int64_t d = 0; d < D; ++d) dst[d] += row[d];
      }
  });
}

// out[b, :] = x[b, T-1, :] for x [B, T, D].
void gather_last(const Tensor& x, const Tensor& out, int64_t B, int64_t T) {
  const int64_t D = out.dim(1);
  const size_t row_bytes = static_cast<size_t>(D) * dtype_size(x.dtype());
  const char* px = static_cast<const char*>(x.raw());
  char* po = static_cast<char*>(out.raw());
  for (int64_t b = 0; b < B; ++b)
    std::memcpy(po + b * row_bytes, px + ((b * T + T - 1) * D) * dtype_size(x.dtype()), row_bytes);
}

double softplus_inverse(double y) { return y + std::log(-std::expm1(-y)); }

// The last dotted component of a parameter name: "layers.3.mixer.wo" → "wo".
std::string leaf(const std::string& name) {
  size_t dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(dot + 1);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Parameter table

std::vector<ParamInfo> param_table(const ModelConfig& cfg) {
  validate(cfg);
  std::vector<ParamInfo> table;
  int64_t offset = 0;
  auto add = [&](const std::string& name, Shape shape, bool decay, const std::string& group,
                 bool trainable = true) {
    ParamInfo p;
    p.name = name;
    p.numel = shape_numel(shape);
    p.shape = std::move(shape);
    offset = align_param(offset);
    p.offset = offset;
    p.decay = decay;
    p.group = group;
    p.trainable = trainable;
    offset += p.numel;
    table.push_back(std::move(p));
  };
  const int64_t V = cfg.vocab_size, D = cfg.d_model, H = cfg.n_heads, Dh = cfg.head_dim();
  const int64_t F = cfg.ffn.width, kv = cfg.kv_heads() * Dh;
  const bool layernorm = cfg.norm == "layernorm";
  auto norm = [&](const std::string& prefix) {
    add(prefix + ".weight", {D}, false, "norm");
    if (layernorm) add(prefix + ".bias", {D}, false, "norm");
  };

  add("tok_emb", {V, D}, true, "embedding");
  if (cfg.positions == "learned") add("pos_emb", {cfg.context, D}, true, "embedding");
  for (int64_t l = 0; l < cfg.n_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    const char kind = cfg.pattern[l];
    norm(p + "norm1");
    if (kind == 'A') {
      const std::string g = "attention";
      add(p + "mixer.wq", {D, D}, true, g);
      add(p + "mixer.wk", {D, kv}, true, g);
      add(p + "mixer.wv", {D, kv}, true, g);
      add(p + "mixer.wo", {D, D}, true, g);
      if (cfg.attn_bias) {
        add(p + "mixer.bq", {D}, false, g);
        add(p + "mixer.bk", {kv}, false, g);
        add(p + "mixer.bv", {kv}, false, g);
        add(p + "mixer.bo", {D}, false, g);
      }
    } else {
      const std::string g = kind == 'F' ? "relation" : "linear_relation";
      const bool wi = !cfg.relation.raw_x;
      add(p + "mixer.w1", {D, D}, true, g);
      add(p + "mixer.w2", {D, D}, true, g);
      if (wi) add(p + "mixer.wi", {D, D}, true, g);
      add(p + "mixer.wo", {D, D}, true, g);
      if (cfg.attn_bias) {
        add(p + "mixer.b1", {D}, false, g);
        add(p + "mixer.b2", {D}, false, g);
        if (wi) add(p + "mixer.bi", {D}, false, g);
        add(p + "mixer.bo", {D}, false, g);
      }
      if (cfg.relation.givens && H > 1) add(p + "mixer.theta", {H / 2}, false, g);
      if (kind == 'F') {
        add(p + "mixer.lambda", {1}, false, g, !cfg.relation.lambda_frozen);
      } else {
        add(p + "mixer.w_alpha_down", {D, Dh}, true, g);
        add(p + "mixer.w_alpha_up", {Dh, H * Dh}, true, g);
        add(p + "mixer.a_log", {H}, false, g);
        add(p + "mixer.dt_bias", {H * Dh}, false, g);
      }
    }
    norm(p + "norm2");
    if (cfg.ffn.kind == "swiglu") add(p + "ffn.gate", {D, F}, true, "ffn");
    add(p + "ffn.up", {D, F}, true, "ffn");
    add(p + "ffn.down", {F, D}, true, "ffn");
    if (cfg.ffn.bias) {
      if (cfg.ffn.kind == "swiglu") add(p + "ffn.gate_bias", {F}, false, "ffn");
      add(p + "ffn.up_bias", {F}, false, "ffn");
      add(p + "ffn.down_bias", {D}, false, "ffn");
    }
  }
  norm("norm_f");
  if (!cfg.tied_head) add("head", {D, V}, true, "head");
  return table;
}

std::vector<size_t> backward_stage_starts(const ModelConfig& cfg) {
  const std::vector<ParamInfo> table = param_table(cfg);
  auto first_named = [&](const std::string& prefix) {
    for (size_t i = 0; i < table.size(); ++i)
      if (table[i].name.rfind(prefix, 0) == 0) return i;
    fail("backward_stage_starts: the parameter table of '{}' has no '{}*' entry", cfg.name, prefix);
  };
  std::vector<size_t> starts = {first_named("norm_f.")};
  for (int64_t l = cfg.n_layers - 1; l >= 0; --l) starts.push_back(first_named("layers." + std::to_string(l) + "."));
  starts.push_back(0);
  return starts;
}

int64_t count_params(const ModelConfig& cfg) {
  int64_t n = 0;
  for (const ParamInfo& p : param_table(cfg)) n += p.numel;
  return n;
}

// ---------------------------------------------------------------------------------------------
// Layers and activations

namespace {

// A parameter's value and gradient views; undefined when the config has no such tensor.
struct Param {
  Tensor value, grad;
  bool defined() const { return value.defined(); }
};

}  // namespace

struct Model::Layer {
  char kind = 'A';
  Param norm1_w, norm1_b, norm2_w, norm2_b;
  // Input projections of the mixer: A: q, k, v; F and L: p1, p2, I (w_in[2] undefined with raw_x).
  Param w_in[3], b_in[3];
  Param w_out, b_out;
  Param theta, lambda;                               // F and L: Givens angles; F: λ
  Param w_alpha_down, w_alpha_up, a_log, dt_bias;    // L: retention gate
  Param ffn_gate, ffn_up, ffn_down, ffn_gate_b, ffn_up_b, ffn_down_b;
};

namespace {

// Saved activations of one layer for a [B, T] block (N = B·T rows).
struct LayerActs {
  Tensor x_in, h1, mean1, rstd1;      // residual before the mixer [N, D], norm1 output, stats [N]
  Tensor a, b, c;                     // projections: q, k, v (A) or p1, p2, I (F, L) after RoPE
  Tensor mixed;                       // Ĩ after Givens (F, L) [N, D]
  Tensor gate;                        // L: log-decay g [N, D]
  Tensor y;                           // mixer output before W_O [N, D]
  Tensor lse;                         // A: [B, H, T]
  Tensor stats;                       // F: [B, H, T, 3]
  Tensor x_mid, h2, mean2, rstd2;     // residual before the FFN, norm2 output, stats
  Tensor f_gate, f_up, f_act;         // FFN [N, F]: swiglu gate and up, or gelu pre-activation (f_up)
};

}  // namespace

struct Model::Activations {
  int64_t B = 0, T = 0;
  std::vector<LayerActs> layers;      // one per layer when training, else one shared slot
  Tensor x_final, hf, mean_f, rstd_f;  // [N, D], [N]
  Tensor logits, dlogits;             // [N, V]
  Tensor last_x, last_h, last_mean, last_rstd;  // prefill: the last position's rows [B, D], [B]
  std::vector<int> row_types;         // FFN row types of the block (algebraic law)
  // Backward scratch, shared by the layers.
  Tensor dx, dh, dtmp, dy, da, db, dc, dmixed, dgate;  // [N, D]
  Tensor df_gate, df_up, df_act;                        // [N, F]
  Tensor dw_scratch;                                    // AlgProj weight gradient, [max(D·F)]
  Tensor dtheta, da_log, ddt_bias, dw_alpha_down, dw_alpha_up;

  LayerActs& slot(int64_t l) { return layers.size() == 1 ? layers[0] : layers[l]; }
};

// ---------------------------------------------------------------------------------------------
// Decode state

DecodeState::~DecodeState() = default;

namespace {

struct DecodeStateImpl final : DecodeState {
  int64_t B = 0, cap = 0, pos = 0;
  std::vector<ops::KVCache> kv;            // per layer (A layers)
  std::vector<ops::RelationCache> rel;     // per layer (F layers)
  std::vector<Tensor> lin;                 // per layer (L layers): C [B, H, Dh, Dh]
  // One step's rows, preallocated.
  Tensor x, h, a, b, c, mixed, gate, y, mean, rstd;   // [B, D] / [B]
  Tensor f_gate, f_up, f_act;                          // [B, F]
  std::vector<int> row_types;                          // [B]
  const void* owner = nullptr;

  int64_t batch() const override { return B; }
  int64_t capacity() const override { return cap; }
  int64_t position() const override { return pos; }
};

DecodeStateImpl& impl(DecodeState& s, const void* owner) {
  auto* p = dynamic_cast<DecodeStateImpl*>(&s);
  QV_CHECK(p != nullptr && p->owner == owner, "decode state was not made by this model (new_decode_state)");
  return *p;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Construction and initialization

Model::Model(ModelConfig cfg, DType dtype) : cfg_(std::move(cfg)), dtype_(dtype) {
  QV_CHECK(dtype == DType::F32 || dtype == DType::F64, "the CPU model holds F32 or F64 parameters, got {}",
           dtype_name(dtype));
  table_ = model::param_table(cfg_);
  int64_t total = table_.empty() ? 0 : table_.back().offset + table_.back().numel;
  params_ = Tensor::zeros({total}, dtype_);
  grads_ = Tensor::zeros({total}, dtype_);

  std::map<std::string, size_t> index;
  for (size_t i = 0; i < table_.size(); ++i) index[table_[i].name] = i;
  auto get = [&](const std::string& name) {
    Param p;
    auto it = index.find(name);
    if (it == index.end()) return p;
    const ParamInfo& info = table_[it->second];
    p.value = params_.slice(0, info.offset, info.offset + info.numel).reshape(info.shape);
    p.grad = grads_.slice(0, info.offset, info.offset + info.numel).reshape(info.shape);
    return p;
  };
  for (int64_t l = 0; l < cfg_.n_layers; ++l) {
    auto L = std::make_unique<Layer>();
    model::bind_layer_params(*L, cfg_.pattern[l], l, get);
    layers_.push_back(std::move(L));
  }
  tok_emb_ = get("tok_emb").value;
  tok_emb_grad_ = get("tok_emb").grad;
  pos_emb_ = get("pos_emb").value;
  pos_emb_grad_ = get("pos_emb").grad;
  head_ = get("head").value;
  head_grad_ = get("head").grad;
  norm_f_w_ = get("norm_f.weight").value;
  norm_f_w_grad_ = get("norm_f.weight").grad;
  norm_f_b_ = get("norm_f.bias").value;
  norm_f_b_grad_ = get("norm_f.bias").grad;

  if (std::optional<model::FfnLaw> alg = model::ffn_law(cfg_)) {
    ffn_q_ = alg->law.q();
    ffn_schedule_ = alg->schedule;
    ffn_up_proj_ = std::make_unique<ops::AlgProj>(alg->law, alg->up);
    ffn_down_proj_ = std::make_unique<ops::AlgProj>(alg->law, alg->down);
  }
}

Model::~Model() = default;

const ParamInfo& Model::param_info(const std::string& name) const {
  for (const ParamInfo& p : table_)
    if (p.name == name) return p;
  fail("model {} has no parameter \"{}\"", cfg_.name, name);
}

Tensor Model::param(const std::string& name) const {
  const ParamInfo& p = param_info(name);
  return params_.slice(0, p.offset, p.offset + p.numel).reshape(p.shape);
}

Tensor Model::grad(const std::string& name) const {
  const ParamInfo& p = param_info(name);
  return grads_.slice(0, p.offset, p.offset + p.numel).reshape(p.shape);
}

void Model::init(uint64_t seed) {
  Rng rng(seed);
  const double std = cfg_.init_std;
  const double residual_std = std / std::sqrt(2.0 * static_cast<double>(cfg_.n_layers));
  for (const ParamInfo& info : table_) {
    Tensor t = params_.slice(0, info.offset, info.offset + info.numel);
    const std::string name = leaf(info.name);
    if (info.group == "norm") {
      t.fill(name == "weight" ? 1.0 : 0.0);
    } else if (name == "lambda") {
      t.fill(cfg_.relation.lambda_init);
    } else if (name == "theta") {
      t.fill(0.0);
    } else if (name == "a_log") {
      Tensor v = Tensor::empty({info.numel}, DType::F64);
      for (int64_t i = 0; i < info.numel; ++i) v.data<double>()[i] = std::log(rng.uniform(1.0, 16.0));
      t.copy_from(v);
    } else if (name == "dt_bias") {
      Tensor v = Tensor::empty({info.numel}, DType::F64);
      for (int64_t i = 0; i < info.numel; ++i) {
        double dt = std::exp(rng.uniform(std::log(1e-3), std::log(1e-1)));
        v.data<double>()[i] = softplus_inverse(dt);
      }
      t.copy_from(v);
    } else if (info.shape.size() == 1) {
      t.fill(0.0);  // biases
    } else {
      const bool residual_out = name == "wo" || name == "down";
      rng.fill_normal(t, 0.0, residual_out ? residual_std : std);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Activations

void Model::ensure_activations(int64_t B, int64_t T, bool training) {
  std::unique_ptr<Activations>& acts = training ? train_acts_ : infer_acts_;
  if (acts && acts->B == B && acts->T == T) return;
  acts.reset();  // free the old shape's buffers before allocating the new ones
  auto a = std::make_unique<Activations>();
  a->B = B;
  a->T = T;
  const int64_t N = B * T, D = cfg_.d_model, F = cfg_.ffn.width, H = cfg_.n_heads, Dh = cfg_.head_dim();
  const int64_t kv = cfg_.kv_heads() * Dh;
  auto mat = [&](int64_t rows, int64_t cols) { return Tensor::empty({rows, cols}, dtype_); };
  auto vec = [&](int64_t n) { return Tensor::empty({n}, dtype_); };
  const bool swiglu = cfg_.ffn.kind == "swiglu";

  auto make_slot = [&](const std::string& kinds) {
    LayerActs s;
    s.x_in = mat(N, D);
    s.h1 = mat(N, D);
    s.mean1 = vec(N);
    s.rstd1 = vec(N);
    const bool has_a = kinds.find('A') != std::string::npos;
    const bool has_f = kinds.find('F') != std::string::npos;
    const bool has_l = kinds.find('L') != std::string::npos;
    const int64_t bc_width = has_a && !has_f && !has_l ? kv : D;
    s.a = mat(N, D);
    s.b = mat(N, bc_width);
    s.c = mat(N, bc_width);
    if (has_f || has_l) s.mixed = mat(N, D);
    if (has_l) s.gate = mat(N, D);
    s.y = mat(N, D);
    if (has_a) s.lse = Tensor::empty({B, H, T}, dtype_);
    if (has_f) s.stats = Tensor::empty({B, H, T, ops::kRelationStatCount}, dtype_);
    s.x_mid = mat(N, D);
    s.h2 = mat(N, D);
    s.mean2 = vec(N);
    s.rstd2 = vec(N);
    if (swiglu) s.f_gate = mat(N, F);
    s.f_up = mat(N, F);
    s.f_act = mat(N, F);
    return s;
  };
  if (training) {
    for (int64_t l = 0; l < cfg_.n_layers; ++l) a->layers.push_back(make_slot(std::string(1, cfg_.pattern[l])));
  } else {
    a->layers.push_back(make_slot(cfg_.pattern));
  }
  a->x_final = mat(N, D);
  a->hf = mat(N, D);
  a->mean_f = vec(N);
  a->rstd_f = vec(N);
  if (training) a->logits = mat(N, cfg_.vocab_size);  // inference: allocated by forward_loss when used
  a->last_x = mat(B, D);
  a->last_h = mat(B, D);
  a->last_mean = vec(B);
  a->last_rstd = vec(B);
  if (ffn_up_proj_) a->row_types = ffn_schedule_.batch_types(B, T, 0, ffn_q_);
  if (training) {
    a->dlogits = mat(N, cfg_.vocab_size);
    for (Tensor* t : {&a->dx, &a->dh, &a->dtmp, &a->dy, &a->da, &a->db, &a->dc, &a->dmixed, &a->dgate})
      *t = mat(N, D);
    if (swiglu) a->df_gate = mat(N, F);
    a->df_up = mat(N, F);
    a->df_act = mat(N, F);
    if (ffn_up_proj_) a->dw_scratch = vec(D * F);
    if (H > 1) a->dtheta = vec(H / 2);
    a->da_log = vec(H);
    a->ddt_bias = vec(H * Dh);
    a->dw_alpha_down = mat(D, Dh);
    a->dw_alpha_up = mat(Dh, H * Dh);
  }
  acts = std::move(a);
}

// ---------------------------------------------------------------------------------------------
// Forward

namespace {

void norm_forward(const ModelConfig& cfg, const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y,
                  Tensor& mean, Tensor& rstd) {
  if (cfg.norm == "layernorm")
    ops::layernorm_forward(x, w, b, cfg.norm_eps, y, mean, rstd);
  else
    ops::rmsnorm_forward(x, w, cfg.norm_eps, y, rstd);
}

void norm_backward(const ModelConfig& cfg, const Tensor& dy, const Tensor& x, const Param& w, const Param& b,
                   const Tensor& mean, const Tensor& rstd, Tensor& dx) {
  Tensor gw = w.grad;
  if (cfg.norm == "layernorm") {
    Tensor gb = b.grad;
    ops::layernorm_backward(dy, x, w.value, mean, rstd, dx, gw, gb);
  } else {
    ops::rmsnorm_backward(dy, x, w.value, rstd, dx, gw);
  }
}

Shape heads_shape(int64_t B, int64_t T, int64_t heads, int64_t Dh) { return {B, T, heads, Dh}; }

// The algebraic FFN projections of a model (both null for the dense law) and the row types
// of the rows being processed.
struct FfnAlgebra {
  const ops::AlgProj* up = nullptr;    // D → F (gate and up)
  const ops::AlgProj* down = nullptr;  // F → D
  const std::vector<int>* row_types = nullptr;
};

// y = x W (+ b) for an FFN projection: dense, or algebraic with the rows' types.
void ffn_project(const Tensor& x, const Param& w, const Param& b, const ops::AlgProj* alg,
                 const std::vector<int>& row_types, Tensor& y) {
  if (alg)
    alg->forward(x, w.value, row_types, y);
  else
    ops::linear_forward(x, w.value, b.value, y);
}

// out = ffn(h2); f_gate, f_up, f_act keep what the backward needs.
void ffn_forward(const ModelConfig& cfg, const Model::Layer& L, const FfnAlgebra& alg, const Tensor& h2,
                 Tensor& f_gate, Tensor& f_up, Tensor& f_act, Tensor& out) {
  const std::vector<int>& types = *alg.row_types;
  if (cfg.ffn.kind == "swiglu") {
    ffn_project(h2, L.ffn_gate, L.ffn_gate_b, alg.up, types, f_gate);
    ffn_project(h2, L.ffn_up, L.ffn_up_b, alg.up, types, f_up);
    ops::swiglu_forward(f_gate, f_up, f_act);
  } else {
    ffn_project(h2, L.ffn_up, L.ffn_up_b, alg.up, types, f_up);
    ops::gelu_forward(f_up, f_act);
  }
  ffn_project(f_act, L.ffn_down, L.ffn_down_b, alg.down, types, out);
}

}  // namespace

void Model::forward(const int32_t* tokens, int64_t B, int64_t T, Mode mode, DecodeState* state) {
  QV_CHECK(B >= 1, "batch size must be ≥ 1, got {}", B);
  QV_CHECK(T >= 1 && T <= cfg_.context, "sequence length T = {} must be in [1, context = {}]", T, cfg_.context);
  const bool training = mode == Mode::Train;
  ensure_activations(B, T, training);
  Activations& A = training ? *train_acts_ : *infer_acts_;
  const int64_t N = B * T, D = cfg_.d_model, H = cfg_.n_heads, Dh = cfg_.head_dim(), Hkv = cfg_.kv_heads();
  const bool rope = cfg_.positions == "rope";
  ops::RelationOptions rel_opts;
  rel_opts.tau_s = cfg_.relation.tau_s;
  rel_opts.exchange_only = cfg_.relation.exchange_only;
  DecodeStateImpl* ds = state ? &impl(*state, this) : nullptr;
  const FfnAlgebra ffn_alg{ffn_up_proj_.get(), ffn_down_proj_.get(), &A.row_types};

  Tensor x0 = A.slot(0).x_in;
  ops::embedding_forward(tokens, N, tok_emb_, x0);
  if (!rope) add_positions(x0, pos_emb_, B, T, 0);

  for (int64_t l = 0; l < cfg_.n_layers; ++l) {
    const Layer& L = *layers_[l];
    LayerActs& s = A.slot(l);
    norm_forward(cfg_, s.x_in, L.norm1_w.value, L.norm1_b.value, s.h1, s.mean1, s.rstd1);

    if (L.kind == 'A') {
      const int64_t kvw = Hkv * Dh;
      // k and v use a contiguous prefix of their buffers (sized for width D in a shared slot).
      Tensor q = s.a;
      Tensor k = s.b.reshape({-1}).slice(0, 0, N * kvw).reshape({N, kvw});
      Tensor v = s.c.reshape({-1}).slice(0, 0, N * kvw).reshape({N, kvw});
      ops::linear_forward(s.h1, L.w_in[0].value, L.b_in[0].value, q);
      ops::linear_forward(s.h1, L.w_in[1].value, L.b_in[1].value, k);
      ops::linear_forward(s.h1, L.w_in[2].value, L.b_in[2].value, v);
      Tensor q4 = q.reshape(heads_shape(B, T, H, Dh)), k4 = k.reshape(heads_shape(B, T, Hkv, Dh));
      Tensor v4 = v.reshape(heads_shape(B, T, Hkv, Dh)), y4 = s.y.reshape(heads_shape(B, T, H, Dh));
      if (rope) {
        ops::rope_forward(q4, q4, 0, cfg_.rope_base);
        ops::rope_forward(k4, k4, 0, cfg_.rope_base);
      }
      ops::attention_forward(q4, k4, v4, y4, s.lse);
      if (ds) ds->kv[l].append(k4, v4);
    } else {
      Tensor p1 = s.a, p2 = s.b, I = cfg_.relation.raw_x ? s.h1 : s.c;
      ops::linear_forward(s.h1, L.w_in[0].value, L.b_in[0].value, p1);
      ops::linear_forward(s.h1, L.w_in[1].value, L.b_in[1].value, p2);
      if (!cfg_.relation.raw_x) ops::linear_forward(s.h1, L.w_in[2].value, L.b_in[2].value, I);
      const Shape hs = heads_shape(B, T, H, Dh);
      Tensor p14 = p1.reshape(hs), p24 = p2.reshape(hs), I4 = I.reshape(hs);
      if (rope) {
        ops::rope_forward(p14, p14, 0, cfg_.rope_base);
        ops::rope_forward(p24, p24, 0, cfg_.rope_base);
      }
      Tensor mixed4 = I4;
      if (L.theta.defined()) {
        mixed4 = s.mixed.reshape(hs);
        ops::givens_forward(I4, L.theta.value, l, mixed4);
      }
      Tensor y4 = s.y.reshape(hs);
      if (L.kind == 'F') {
        ops::flash_relation_forward(p14, p24, mixed4, read_scalar(L.lambda.value), y4, s.stats, rel_opts);
        if (ds) ds->rel[l].append(p24, mixed4);
      } else {
        Tensor g4 = s.gate.reshape(hs);
        ops::retention_gate_forward(s.h1.reshape({B, T, D}), L.w_alpha_down.value, L.w_alpha_up.value,
                                    L.a_log.value, L.dt_bias.value, g4);
        if (ds) {
          Tensor C = ops::linear_relation_prefill(p14, p24, mixed4, g4, y4, dtype_, kLinearRelationChunk,
                                                  cfg_.relation.tau_s);
          ds->lin[l].copy_from(C);
        } else {
          ops::linear_relation_chunked_forward(p14, p24, mixed4, g4, y4, kLinearRelationChunk,
                                               cfg_.relation.tau_s);
        }
      }
    }
    ops::linear_forward(s.y, L.w_out.value, L.b_out.value, s.x_mid);
    add_into(s.x_mid, s.x_in);

    norm_forward(cfg_, s.x_mid, L.norm2_w.value, L.norm2_b.value, s.h2, s.mean2, s.rstd2);
    Tensor next = l + 1 < cfg_.n_layers ? A.slot(l + 1).x_in : A.x_final;
    ffn_forward(cfg_, L, ffn_alg, s.h2, s.f_gate, s.f_up, s.f_act, next);
    add_into(next, s.x_mid);
  }

  if (mode == Mode::Prefill) {
    gather_last(A.x_final, A.last_x, B, T);
    norm_forward(cfg_, A.last_x, norm_f_w_, norm_f_b_, A.last_h, A.last_mean, A.last_rstd);
    return;
  }
  norm_forward(cfg_, A.x_final, norm_f_w_, norm_f_b_, A.hf, A.mean_f, A.rstd_f);
}

void Model::project_head(const Tensor& h, Tensor& logits) const {
  if (cfg_.tied_head)
    matmul(h, false, tok_emb_, true, logits, 0.0);
  else
    ops::linear_forward(h, head_, Tensor(), logits);
}

double Model::forward_loss(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T) {
  forward(tokens, B, T, Mode::Loss, nullptr);
  Activations& A = *infer_acts_;
  if (!A.logits.defined()) A.logits = Tensor::empty({B * T, cfg_.vocab_size}, dtype_);
  project_head(A.hf, A.logits);
  return ops::cross_entropy_forward_backward(A.logits, targets, 1.0f, nullptr);
}

void Model::forward_logits(const int32_t* tokens, int64_t B, int64_t T, Tensor& logits) {
  const Shape shape{B, T, cfg_.vocab_size};
  if (!logits.defined()) logits = Tensor::empty(shape, dtype_);
  check_shape(logits, shape, "logits");
  check_dtype(logits, dtype_, "logits");
  check_cpu_contiguous(logits, "logits");
  forward(tokens, B, T, Mode::Logits, nullptr);
  Tensor flat = logits.reshape({B * T, cfg_.vocab_size});
  project_head(infer_acts_->hf, flat);
}

// ---------------------------------------------------------------------------------------------
// Backward

namespace {

// dx (+)= dy Wᵀ, dW += xᵀ dy, db += Σ dy for a dense projection (beta 0 assigns dx, 1 adds).
void dense_backward(const Tensor& dy, const Tensor& x, const Param& w, const Param& b, const Tensor* dx,
                    double beta) {
  Tensor gw = w.grad, gb = b.grad;
  ops::linear_backward(dy, x, w.value, nullptr, gw, b.defined() ? &gb : nullptr);
  if (dx) matmul(dy, false, w.value, true, *dx, beta);
}

// Backward of an FFN projection: dense, or algebraic (AlgProj assigns dx and dw, so dw goes
// through dw_scratch and, when accumulating, dx through dx_scratch).
void ffn_project_backward(const Tensor& dy, const Tensor& x, const Param& w, const Param& b,
                          const ops::AlgProj* alg, const std::vector<int>& row_types, const Tensor& dx,
                          bool accumulate, const Tensor& dw_scratch, const Tensor& dx_scratch) {
  if (!alg) {
    dense_backward(dy, x, w, b, &dx, accumulate ? 1.0 : 0.0);
    return;
  }
  Tensor dw = dw_scratch.slice(0, 0, w.value.numel()).reshape(w.value.shape());
  Tensor dx_target = dx;
  if (accumulate) dx_target = dx_scratch.reshape({-1}).slice(0, 0, dx.numel()).reshape(dx.shape());
  alg->backward(x, w.value, dy, row_types, &dx_target, &dw);
  add_into(w.grad, dw);
  if (accumulate) add_into(dx, dx_target);
}

}  // namespace

void Model::backward(const int32_t* tokens, int64_t B, int64_t T) {
  Activations& A = *train_acts_;
  const int64_t N = B * T, D = cfg_.d_model, H = cfg_.n_heads, Dh = cfg_.head_dim(), Hkv = cfg_.kv_heads();
  const bool rope = cfg_.positions == "rope";
  ops::RelationOptions rel_opts;
  rel_opts.tau_s = cfg_.relation.tau_s;
  rel_opts.exchange_only = cfg_.relation.exchange_only;
  const Shape hs = heads_shape(B, T, H, Dh);
  const ops::AlgProj* up = ffn_up_proj_.get();
  const ops::AlgProj* down = ffn_down_proj_.get();
  const std::vector<int>& types = A.row_types;

  // Head: logits = hf · Wᵀ (tied) or hf · W_head.
  if (cfg_.tied_head) {
    matmul(A.dlogits, false, tok_emb_, false, A.dh, 0.0);
    matmul(A.dlogits, true, A.hf, false, tok_emb_grad_, 1.0);
  } else {
    Tensor gh = head_grad_;
    ops::linear_backward(A.dlogits, A.hf, head_, &A.dh, gh, nullptr);
  }
  {
    Param w{norm_f_w_, norm_f_w_grad_}, b{norm_f_b_, norm_f_b_grad_};
    norm_backward(cfg_, A.dh, A.x_final, w, b, A.mean_f, A.rstd_f, A.dx);
  }

  for (int64_t l = cfg_.n_layers - 1; l >= 0; --l) {
    const Layer& L = *layers_[l];
    LayerActs& s = A.slot(l);

    // FFN: x_next = x_mid + down(act(h2 ...)); A.dx holds d x_next.
    Tensor& dact = A.df_act;
    ffn_project_backward(A.dx, s.f_act, L.ffn_down, L.ffn_down_b, down, types, dact, false, A.dw_scratch,
                         A.dtmp);
    if (cfg_.ffn.kind == "swiglu") {
      ops::swiglu_backward(dact, s.f_gate, s.f_up, A.df_gate, A.df_up);
      ffn_project_backward(A.df_gate, s.h2, L.ffn_gate, L.ffn_gate_b, up, types, A.dh, false, A.dw_scratch,
                           A.dtmp);
      ffn_project_backward(A.df_up, s.h2, L.ffn_up, L.ffn_up_b, up, types, A.dh, true, A.dw_scratch, A.dtmp);
    } else {
      ops::gelu_backward(dact, s.f_up, A.df_up);
      ffn_project_backward(A.df_up, s.h2, L.ffn_up, L.ffn_up_b, up, types, A.dh, false, A.dw_scratch,
                           A.dtmp);
    }
    norm_backward(cfg_, A.dh, s.x_mid, L.norm2_w, L.norm2_b, s.mean2, s.rstd2, A.dtmp);
    add_into(A.dx, A.dtmp);  // now d x_mid

    // Mixer: x_mid = x_in + y W_O (+ b_O).
    dense_backward(A.dx, s.y, L.w_out, L.b_out, &A.dy, 0.0);
    if (L.kind == 'A') {
      const int64_t kvw = Hkv * Dh;
      Tensor dk = A.db.reshape({-1}).slice(0, 0, N * kvw).reshape({N, kvw});
      Tensor dv = A.dc.reshape({-1}).slice(0, 0, N * kvw).reshape({N, kvw});
      Tensor q4 = s.a.reshape(hs), k4 = s.b.reshape(heads_shape(B, T, Hkv, Dh));
      Tensor v4 = s.c.reshape(heads_shape(B, T, Hkv, Dh));
      Tensor dq4 = A.da.reshape(hs), dk4 = dk.reshape(heads_shape(B, T, Hkv, Dh));
      Tensor dv4 = dv.reshape(heads_shape(B, T, Hkv, Dh));
      ops::attention_backward(q4, k4, v4, s.y.reshape(hs), s.lse, A.dy.reshape(hs), dq4, dk4, dv4);
      if (rope) {
        ops::rope_backward(dq4, dq4, 0, cfg_.rope_base);
        ops::rope_backward(dk4, dk4, 0, cfg_.rope_base);
      }
      dense_backward(A.da, s.h1, L.w_in[0], L.b_in[0], &A.dh, 0.0);
      dense_backward(dk, s.h1, L.w_in[1], L.b_in[1], &A.dh, 1.0);
      dense_backward(dv, s.h1, L.w_in[2], L.b_in[2], &A.dh, 1.0);
    } else {
      Tensor I = cfg_.relation.raw_x ? s.h1 : s.c;
      Tensor p14 = s.a.reshape(hs), p24 = s.b.reshape(hs), I4 = I.reshape(hs);
      Tensor mixed4 = L.theta.defined() ? s.mixed.reshape(hs) : I4;
      Tensor dp14 = A.da.reshape(hs), dp24 = A.db.reshape(hs), dmixed4 = A.dmixed.reshape(hs);
      Tensor y4 = s.y.reshape(hs), dy4 = A.dy.reshape(hs);
      if (L.kind == 'F') {
        double dlambda = ops::flash_relation_backward(p14, p24, mixed4, read_scalar(L.lambda.value), y4, s.stats,
                                                      dy4, dp14, dp24, dmixed4, rel_opts);
        if (!cfg_.relation.lambda_frozen) add_scalar(L.lambda.grad, dlambda);
      } else {
        Tensor g4 = s.gate.reshape(hs), dg4 = A.dgate.reshape(hs);
        ops::linear_relation_chunked_backward(p14, p24, mixed4, g4, dy4, dp14, dp24, dmixed4, dg4,
                                              kLinearRelationChunk, cfg_.relation.tau_s);
        ops::retention_gate_backward(s.h1.reshape({B, T, D}), L.w_alpha_down.value, L.w_alpha_up.value,
                                     L.a_log.value, L.dt_bias.value, dg4, A.dtmp.reshape({B, T, D}),
                                     A.dw_alpha_down, A.dw_alpha_up, A.da_log, A.ddt_bias);
        add_into(L.w_alpha_down.grad, A.dw_alpha_down);
        add_into(L.w_alpha_up.grad, A.dw_alpha_up);
        add_into(L.a_log.grad, A.da_log);
        add_into(L.dt_bias.grad, A.ddt_bias);
      }
      // dI: through the Givens rotation (in place), or Ĩ = I.
      Tensor dI4 = dmixed4;
      if (L.theta.defined()) {
        ops::givens_backward(dmixed4, I4, L.theta.value, l, dI4, A.dtheta);
        add_into(L.theta.grad, A.dtheta);
      }
      if (rope) {
        ops::rope_backward(dp14, dp14, 0, cfg_.rope_base);
        ops::rope_backward(dp24, dp24, 0, cfg_.rope_base);
      }
      // dh = dp1 W1ᵀ + dp2 W2ᵀ + dI WIᵀ (or + dI with raw_x) (+ the gate's dh for L).
      if (L.kind == 'L') {
        std::swap(A.dh, A.dtmp);  // the gate's dh becomes the start of the sum
        dense_backward(A.da, s.h1, L.w_in[0], L.b_in[0], &A.dh, 1.0);
      } else {
        dense_backward(A.da, s.h1, L.w_in[0], L.b_in[0], &A.dh, 0.0);
      }
      dense_backward(A.db, s.h1, L.w_in[1], L.b_in[1], &A.dh, 1.0);
      if (cfg_.relation.raw_x)
        add_into(A.dh, A.dmixed);
      else
        dense_backward(A.dmixed, s.h1, L.w_in[2], L.b_in[2], &A.dh, 1.0);
    }
    norm_backward(cfg_, A.dh, s.x_in, L.norm1_w, L.norm1_b, s.mean1, s.rstd1, A.dtmp);
    add_into(A.dx, A.dtmp);  // now d x_in
  }

  ops::embedding_backward_accumulate(tokens, N, A.dx, tok_emb_grad_);
  if (!rope) accumulate_positions(A.dx, pos_emb_grad_, B, T);
}

double Model::forward_backward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T,
                               float grad_scale) {
  forward(tokens, B, T, Mode::Train, nullptr);
  Activations& A = *train_acts_;
  project_head(A.hf, A.logits);
  double loss = ops::cross_entropy_forward_backward(A.logits, targets, grad_scale, &A.dlogits);
  backward(tokens, B, T);
  return loss;
}

// ---------------------------------------------------------------------------------------------
// Decoding

std::unique_ptr<DecodeState> Model::new_decode_state(int64_t B, int64_t capacity) const {
  QV_CHECK(B >= 1, "decode batch must be ≥ 1, got {}", B);
  QV_CHECK(capacity >= 1, "decode capacity must be ≥ 1, got {}", capacity);
  if (cfg_.positions == "learned")
    QV_CHECK(capacity <= cfg_.context,
             "decode capacity {} exceeds the context {} of a model with learned positions", capacity,
             cfg_.context);
  auto s = std::make_unique<DecodeStateImpl>();
  s->owner = this;
  s->B = B;
  s->cap = capacity;
  const int64_t D = cfg_.d_model, H = cfg_.n_heads, Dh = cfg_.head_dim(), F = cfg_.ffn.width;
  s->kv.resize(cfg_.n_layers);
  s->rel.resize(cfg_.n_layers);
  s->lin.resize(cfg_.n_layers);
  for (int64_t l = 0; l < cfg_.n_layers; ++l) {
    switch (cfg_.pattern[l]) {
      case 'A': s->kv[l] = ops::KVCache(B, capacity, cfg_.kv_heads(), Dh, dtype_); break;
      case 'F': s->rel[l] = ops::RelationCache(B, capacity, H, Dh, dtype_); break;
      default: s->lin[l] = Tensor::zeros({B, H, Dh, Dh}, dtype_); break;
    }
  }
  for (Tensor* t : {&s->x, &s->h, &s->a, &s->b, &s->c, &s->mixed, &s->gate, &s->y})
    *t = Tensor::empty({B, D}, dtype_);
  s->mean = Tensor::empty({B}, dtype_);
  s->rstd = Tensor::empty({B}, dtype_);
  s->f_gate = Tensor::empty({B, F}, dtype_);
  s->f_up = Tensor::empty({B, F}, dtype_);
  s->f_act = Tensor::empty({B, F}, dtype_);
  s->row_types.assign(B, 0);
  return s;
}

void Model::prefill(DecodeState& state, const int32_t* tokens, int64_t B, int64_t T, Tensor& logits) {
  DecodeStateImpl& s = impl(state, this);
  QV_CHECK(B == s.B, "prefill: the decode state holds {} sequences, got B = {}", s.B, B);
  QV_CHECK(T >= 1, "prefill: needs at least one token, got T = {}", T);
  QV_CHECK(s.pos + T <= s.cap, "prefill: {} + {} tokens exceed the decode capacity {}", s.pos, T, s.cap);
  const Shape shape{B, cfg_.vocab_size};
  if (!logits.defined()) logits = Tensor::empty(shape, dtype_);
  check_shape(logits, shape, "logits");
  check_dtype(logits, dtype_, "logits");
  check_cpu_contiguous(logits, "logits");
  if (s.pos > 0 || T > cfg_.context) {
    // Continue a sequence: token by token (the caches already hold the history).
    std::vector<int32_t> column(B);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t b = 0; b < B; ++b) column[b] = tokens[b * T + t];
      decode_step(state, column.data(), logits);
    }
    return;
  }
  forward(tokens, B, T, Mode::Prefill, &state);
  project_head(infer_acts_->last_h, logits);
  s.pos = T;
}

void Model::decode_step(DecodeState& state, const int32_t* tokens, Tensor& logits) {
  DecodeStateImpl& s = impl(state, this);
  const int64_t B = s.B, D = cfg_.d_model, H = cfg_.n_heads, Dh = cfg_.head_dim(), Hkv = cfg_.kv_heads();
  const int64_t p = s.pos;
  QV_CHECK(p < s.cap, "decode_step: the decode state is full ({} positions)", s.cap);
  const Shape shape{B, cfg_.vocab_size};
  if (!logits.defined()) logits = Tensor::empty(shape, dtype_);
  check_shape(logits, shape, "logits");
  check_dtype(logits, dtype_, "logits");
  check_cpu_contiguous(logits, "logits");
  const bool rope = cfg_.positions == "rope";
  ops::RelationOptions rel_opts;
  rel_opts.tau_s = cfg_.relation.tau_s;
  rel_opts.exchange_only = cfg_.relation.exchange_only;
  if (ffn_up_proj_) std::fill(s.row_types.begin(), s.row_types.end(), ffn_schedule_.type_of(p, ffn_q_));
  const FfnAlgebra ffn_alg{ffn_up_proj_.get(), ffn_down_proj_.get(), &s.row_types};

  ops::embedding_forward(tokens, B, tok_emb_, s.x);
  if (!rope) add_positions(s.x, pos_emb_, B, 1, p);
  const Shape rows{B, H, Dh}, rows4{B, 1, H, Dh};
  for (int64_t l = 0; l < cfg_.n_layers; ++l) {
    const Layer& L = *layers_[l];
    norm_forward(cfg_, s.x, L.norm1_w.value, L.norm1_b.value, s.h, s.mean, s.rstd);
    if (L.kind == 'A') {
      const int64_t kvw = Hkv * Dh;
      Tensor k = s.b.reshape({-1}).slice(0, 0, B * kvw).reshape({B, kvw});
      Tensor v = s.c.reshape({-1}).slice(0, 0, B * kvw).reshape({B, kvw});
      ops::linear_forward(s.h, L.w_in[0].value, L.b_in[0].value, s.a);
      ops::linear_forward(s.h, L.w_in[1].value, L.b_in[1].value, k);
      ops::linear_forward(s.h, L.w_in[2].value, L.b_in[2].value, v);
      if (rope) {
        Tensor q4 = s.a.reshape(rows4), k4 = k.reshape({B, 1, Hkv, Dh});
        ops::rope_forward(q4, q4, p, cfg_.rope_base);
        ops::rope_forward(k4, k4, p, cfg_.rope_base);
      }
      s.kv[l].append_row(k.reshape({B, Hkv, Dh}), v.reshape({B, Hkv, Dh}));
      Tensor y_row = s.y.reshape(rows);
      ops::attention_decode_step(s.a.reshape(rows), s.kv[l], y_row);
    } else {
      Tensor I = cfg_.relation.raw_x ? s.h : s.c;
      ops::linear_forward(s.h, L.w_in[0].value, L.b_in[0].value, s.a);
      ops::linear_forward(s.h, L.w_in[1].value, L.b_in[1].value, s.b);
      if (!cfg_.relation.raw_x) ops::linear_forward(s.h, L.w_in[2].value, L.b_in[2].value, I);
      if (rope) {
        Tensor p14 = s.a.reshape(rows4), p24 = s.b.reshape(rows4);
        ops::rope_forward(p14, p14, p, cfg_.rope_base);
        ops::rope_forward(p24, p24, p, cfg_.rope_base);
      }
      Tensor mixed = I;
      if (L.theta.defined()) {
        mixed = s.mixed;
        Tensor out4 = mixed.reshape(rows4);
        ops::givens_forward(I.reshape(rows4), L.theta.value, l, out4);
      }
      Tensor y_row = s.y.reshape(rows);
      if (L.kind == 'F') {
        ops::relation_decode_step(s.a.reshape(rows), s.b.reshape(rows), mixed.reshape(rows),
                                  read_scalar(L.lambda.value), s.rel[l], y_row, rel_opts);
      } else {
        Tensor g4 = s.gate.reshape(rows4);
        ops::retention_gate_forward(s.h.reshape({B, 1, D}), L.w_alpha_down.value, L.w_alpha_up.value,
                                    L.a_log.value, L.dt_bias.value, g4);
        ops::linear_relation_decode_step(s.a.reshape(rows), s.b.reshape(rows), mixed.reshape(rows),
                                         s.gate.reshape(rows), s.lin[l], y_row, cfg_.relation.tau_s);
      }
    }
    // x += y W_O; x += ffn(norm2(x)). s.mixed is free after the mixer and holds the sublayer outputs.
    ops::linear_forward(s.y, L.w_out.value, L.b_out.value, s.mixed);
    add_into(s.x, s.mixed);
    norm_forward(cfg_, s.x, L.norm2_w.value, L.norm2_b.value, s.h, s.mean, s.rstd);
    ffn_forward(cfg_, L, ffn_alg, s.h, s.f_gate, s.f_up, s.f_act, s.mixed);
    add_into(s.x, s.mixed);
  }
  norm_forward(cfg_, s.x, norm_f_w_, norm_f_b_, s.h, s.mean, s.rstd);
  project_head(s.h, logits);
  s.pos = p + 1;
}

}  // namespace quiver::model

#include "cuda/model.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "cuda/algproj.h"
#include "cuda/attention.h"
#include "cuda/backend.h"
#include "cuda/check.h"
#include "cuda/gemm.h"
#include "cuda/gemm_launch.h"
#include "cuda/givens.h"
#include "cuda/linear_relation.h"
#include "cuda/model_launch.h"
#include "cuda/ops.h"
#include "cuda/relation.h"
#include "model/layer_params.h"
#include "ops/relation.h"
#include "quiver/error.h"

namespace quiver::cuda {

namespace {

constexpr DType kBF16 = DType::BF16;

Tensor device_empty(const Shape& shape, DType dtype) { return Tensor::empty(shape, dtype, Device::CUDA); }
// int32 buffers live in F32-sized storage (the tensor type has no integer dtype).
Tensor device_ints(int64_t n) { return Tensor::empty({std::max<int64_t>(n, 1)}, DType::F32, Device::CUDA); }
int32_t* ints(const Tensor& t) { return static_cast<int32_t*>(t.raw()); }
uint16_t* bf16(const Tensor& t) { return static_cast<uint16_t*>(t.raw()); }
float* f32(const Tensor& t) { return static_cast<float*>(t.raw()); }

// Logits rows are padded to a multiple of 64 elements so that every row starts 128-byte
// aligned when V is odd (GPT-2's 50,257), and the tied head's bf16 table has as many rows (the
// rows past V are zero), so that every dimension of the head GEMMs is a multiple of 64: with
// N = 50,257 the forward head GEMM of alg110m-dense ran at ~100 TFLOP/s on an H200.
int64_t padded_vocab(int64_t V) { return (V + 63) / 64 * 64; }

// The first n·width elements of a buffer as [n, width] (slots sized for the widest use).
Tensor prefix(const Tensor& t, int64_t rows, int64_t width) {
  return t.reshape({-1}).slice(0, 0, rows * width).reshape({rows, width});
}

// y [rows, N] = x [rows, K] · W [K, N] (+ bias) + beta · y, bf16 operands and output.
void project(const Tensor& x, const DeviceParam& w, const DeviceParam& b, Tensor& y, float beta,
             cudaStream_t s) {
  const int64_t K = w.half.dim(0), N = w.half.dim(1), rows = x.numel() / K;
  if (b.defined())
    gemm_epilogue(false, false, rows, N, K, 1.0f, x.raw(), kBF16, K, w.half.raw(), kBF16, N, beta,
                  y.raw(), kBF16, N, Epilogue::Bias, b.half.raw(), kBF16, s);
  else
    gemm(false, false, rows, N, K, 1.0f, x.raw(), kBF16, K, w.half.raw(), kBF16, N, beta, y.raw(),
         kBF16, N, s);
}

// Backward of project: W.grad += xᵀ dy, b.grad += Σ_rows dy, dx = dy Wᵀ + beta · dx (skipped
// when dx is null).
void project_backward(const Tensor& dy, const Tensor& x, const DeviceParam& w, const DeviceParam& b,
                      Tensor* dx, float beta, cudaStream_t s) {
  const int64_t K = w.half.dim(0), N = w.half.dim(1), rows = x.numel() / K;
  gemm(true, false, K, N, rows, 1.0f, x.raw(), kBF16, K, dy.raw(), kBF16, N, 1.0f, w.grad.raw(),
       DType::F32, N, s);
  if (b.defined()) detail::launch_column_sum_accumulate(bf16(dy), rows, N, N, f32(b.grad), s);
  if (dx)
    gemm(false, true, rows, K, N, 1.0f, dy.raw(), kBF16, N, w.half.raw(), kBF16, N, beta, dx->raw(),
         kBF16, K, s);
}

// Whether tensors lie at a fixed stride (in elements) after the first one, as the members of a
// strided batched GEMM must.
bool at_stride(const Tensor* const* t, int count, int64_t stride) {
  for (int j = 1; j < count; ++j)
    if (t[j]->raw() != static_cast<const char*>(t[0]->raw()) + j * stride * static_cast<int64_t>(dtype_size(t[0]->dtype())))
      return false;
  return true;
}

// The parameters of `count` projections of one input through one batched GEMM: the weights
// (one shape), their biases (all or none) and their gradients at a fixed stride. The parameter
// table puts q, k, v (p1, p2, I) and gate, up next to each other, so this holds whenever the
// shapes agree (not for grouped K/V heads).
bool batchable(const DeviceParam* w, const DeviceParam* b, int count) {
  const Tensor* halves[3];
  const Tensor* grads[3];
  const Tensor* biases[3];
  for (int j = 0; j < count; ++j) {
    if (w[j].half.shape() != w[0].half.shape() || b[j].defined() != b[0].defined()) return false;
    halves[j] = &w[j].half;
    grads[j] = &w[j].grad;
    biases[j] = &b[j].half;
  }
  const int64_t size = w[0].half.numel();
  return at_stride(halves, count, size) && at_stride(grads, count, size) &&
         (!b[0].defined() || at_stride(biases, count, w[0].half.dim(1)));
}

// y_j [rows, N] = x [rows, K] · W_j (+ b_j) for j < count (count ≤ 3), assigned: one strided
// batched GEMM when the parameters are batchable and the outputs lie at a stride of rows·N.
void project_many(const Tensor& x, const DeviceParam* w, const DeviceParam* b, Tensor* const* y, int count,
                  cudaStream_t s) {
  const int64_t K = w[0].half.dim(0), N = w[0].half.dim(1), rows = x.numel() / K;
  if (count > 1 && batchable(w, b, count) && at_stride(y, count, rows * N)) {
    gemm_batched(false, false, rows, N, K, 1.0f, x.raw(), kBF16, K, 0, w[0].half.raw(), kBF16, N, K * N, 0.0f,
                 y[0]->raw(), kBF16, N, rows * N, count, b[0].defined() ? Epilogue::Bias : Epilogue::None,
                 b[0].defined() ? b[0].half.raw() : nullptr, kBF16, N, s);
    return;
  }
  for (int j = 0; j < count; ++j) project(x, w[j], b[j], *y[j], 0.0f, s);
}

// Backward of project_many: W_j.grad += xᵀ dy_j (one batched GEMM when batchable), b_j.grad +=
// Σ_rows dy_j, dx = Σ_j dy_j W_jᵀ (assigned).
void project_many_backward(const Tensor* const* dy, const Tensor& x, const DeviceParam* w, const DeviceParam* b,
                           int count, Tensor& dx, cudaStream_t s) {
  const int64_t K = w[0].half.dim(0), N = w[0].half.dim(1), rows = x.numel() / K;
  if (count > 1 && batchable(w, b, count) && at_stride(dy, count, rows * N)) {
    gemm_batched(true, false, K, N, rows, 1.0f, x.raw(), kBF16, K, 0, dy[0]->raw(), kBF16, N, rows * N, 1.0f,
                 w[0].grad.raw(), DType::F32, N, K * N, count, Epilogue::None, nullptr, DType::F32, 0, s);
    for (int j = 0; j < count; ++j) {
      if (b[j].defined()) detail::launch_column_sum_accumulate(bf16(*dy[j]), rows, N, N, f32(b[j].grad), s);
      gemm(false, true, rows, K, N, 1.0f, dy[j]->raw(), kBF16, N, w[j].half.raw(), kBF16, N, j == 0 ? 0.0f : 1.0f,
           dx.raw(), kBF16, K, s);
    }
    return;
  }
  for (int j = 0; j < count; ++j) project_backward(*dy[j], x, w[j], b[j], &dx, j == 0 ? 0.0f : 1.0f, s);
}

// `count` buffers [rows, width] as consecutive slices of one allocation, so that a batched GEMM
// can write (or read) them all.
std::vector<Tensor> adjacent_mats(int count, int64_t rows, int64_t width) {
  Tensor all = device_empty({count * rows, width}, kBF16);
  std::vector<Tensor> out;
  for (int j = 0; j < count; ++j) out.push_back(all.slice(0, j * rows, (j + 1) * rows));
  return out;
}

// The first `count` of a set of adjacent buffers as one tensor of shape `shape` (q and k for one
// RoPE launch); undefined when they are not adjacent.
Tensor joined(const Tensor& first, const Tensor& second, const Shape& shape) {
  const Tensor* pair[2] = {&first, &second};
  if (first.numel() != second.numel() || !at_stride(pair, 2, first.numel())) return Tensor();
  return Tensor::wrap(first.raw(), shape, first.dtype(), first.device());
}

// RoPE of two head tensors with one position layout (q and k; p1 and p2), in place: one launch
// when they are adjacent and of one shape. pos: the decode position (rows [B, heads, Dh]); null
// for rows [B, T, heads, Dh] from position 0 (the inverse rotation when `inverse`).
void rope_pair(Tensor& first, Tensor& second, const int32_t* pos, bool inverse, double base, cudaStream_t s) {
  Shape shape = first.shape();
  shape[0] *= 2;
  Tensor both = first.shape() == second.shape() ? joined(first, second, shape) : Tensor();
  auto apply = [&](Tensor& t) {
    if (pos)
      rope_forward_at(t, t, pos, base, s);
    else if (inverse)
      rope_backward(t, t, 0, base, s);
    else
      rope_forward(t, t, 0, base, s);
  };
  if (both.defined()) {
    apply(both);
    return;
  }
  apply(first);
  apply(second);
}

void copy_async(Tensor& dst, const Tensor& src, cudaStream_t s) {
  QV_CUDA_CHECK(cudaMemcpyAsync(dst.raw(), src.raw(), src.nbytes(), cudaMemcpyDeviceToDevice, s));
}

// Rows [0, T) of each of B sequences of src [B, T, W] into a cache [B, capacity, W] (bf16).
void copy_into_cache(Tensor& cache, const Tensor& src, int64_t B, int64_t T, cudaStream_t s) {
  const size_t row_bytes = static_cast<size_t>(src.numel() / (B * T)) * 2;
  const size_t cap = static_cast<size_t>(cache.dim(1));
  QV_CUDA_CHECK(cudaMemcpy2DAsync(cache.raw(), cap * row_bytes, src.raw(), T * row_bytes, T * row_bytes,
                                  static_cast<size_t>(B), cudaMemcpyDeviceToDevice, s));
}

}  // namespace

struct GpuModel::Layer {
  char kind = 'A';
  DeviceParam norm1_w, norm1_b, norm2_w, norm2_b;
  DeviceParam w_in[3], b_in[3], w_out, b_out;
  DeviceParam theta, lambda, w_alpha_down, w_alpha_up, a_log, dt_bias;
  DeviceParam ffn_gate, ffn_up, ffn_down, ffn_gate_b, ffn_up_b, ffn_down_b;
  // The Givens mixing is folded into the information projection (givens.h): w_in[2].half (and
  // b_in[2].half) hold the rotated weights, so Ĩ comes out of the projection. Not with raw-X
  // communication (I = X has no weight), where the states are rotated.
  bool givens_folded = false;
};

namespace {

// Saved activations of one layer for N = B·T rows (bf16 unless noted).
struct LayerActs {
  Tensor x_in, h1, mean1, rstd1;   // [N, D]; F32 [N]
  Tensor a, b, c;                  // q, k, v (A) or p1, p2, I (F, L), after RoPE
  Tensor mixed;                    // Ĩ after Givens (F, L)
  Tensor gate, r_down;             // L: g F32 [N, D]; x̄ W_down [N, Dh]
  Tensor y;                        // mixer output before W_O
  Tensor lse, stats;               // A: F32 [B, H, T]; F: F32 [B, H, T, 3]
  Tensor x_mid, h2, mean2, rstd2;
  Tensor f_gate, f_up, f_act;      // [N, F]
};

}  // namespace

struct GpuModel::Acts {
  int64_t B = 0, T = 0;
  bool training = false;
  std::vector<LayerActs> layers;   // one per layer when training, else one shared slot
  Tensor tokens, targets;          // int32 [N]
  Tensor x_final, hf, mean_f, rstd_f, logits, dlogits, row_loss, loss;
  Tensor last_x, last_h, last_mean, last_rstd;  // prefill: the last position's rows
  std::vector<int> row_types;
  // Backward scratch shared by the layers.
  Tensor dx, dh, dtmp, dy, da, db, dc, dgate, dr, dr_down;  // da, db, dc adjacent
  Tensor df_gate, df_up, df_act, lin_workspace, rel_workspace;
  Tensor head_dw;                  // F32 [padded V, D]: the tied head's weight gradient, before it is added
  Tensor givens_base;              // F32: W_I's and b_I's gradient so far (folded Givens mixing)
  LayerActs& slot(int64_t l) { return layers.size() == 1 ? layers[0] : layers[l]; }
};

namespace {

// The folded Givens mixing in the backward (Layer::givens_folded). Before the information
// projection's backward, W_I's (and b_I's) gradient so far moves into `base` (views of
// `scratch`) and the slots are zeroed, so that the projection leaves dW̃ there; after it,
// givens_fold_backward makes them base + Gᵀ dW̃ and adds dθ.
void givens_set_aside(const GpuModel::Layer& L, const Tensor& scratch, Tensor base[2], cudaStream_t s) {
  const DeviceParam* p[2] = {&L.w_in[2], &L.b_in[2]};
  int64_t at = 0;
  for (int j = 0; j < 2; ++j) {
    if (!p[j]->defined()) continue;
    const int64_t n = p[j]->grad.numel();
    base[j] = scratch.slice(0, at, at + n).reshape(p[j]->grad.shape());
    at += model::align_param(n);
    QV_CUDA_CHECK(cudaMemcpyAsync(base[j].raw(), p[j]->grad.raw(), p[j]->grad.nbytes(), cudaMemcpyDeviceToDevice, s));
    QV_CUDA_CHECK(cudaMemsetAsync(p[j]->grad.raw(), 0, p[j]->grad.nbytes(), s));
  }
}

// Floats of that scratch: W_I's gradient (rounded up to the parameter alignment), then b_I's.
int64_t givens_scratch_numel(const GpuModel::Layer& L) {
  return model::align_param(L.w_in[2].grad.numel()) + (L.b_in[2].defined() ? L.b_in[2].grad.numel() : 0);
}

void givens_fold_backward(const GpuModel::Layer& L, int64_t layer, int64_t H, int64_t Dh, Tensor base[2],
                          cudaStream_t s) {
  const DeviceParam* p[2] = {&L.w_in[2], &L.b_in[2]};
  Tensor dtheta = L.theta.grad;
  for (int j = 0; j < 2; ++j) {
    if (!p[j]->defined()) continue;
    const Shape heads{p[j]->grad.numel() / (H * Dh), H, Dh};  // the rotation's view: [rows, H, Dh]
    Tensor dw = p[j]->grad.reshape(heads);
    givens_weight_backward(dw, base[j].reshape(heads), p[j]->master.reshape(heads), L.theta.master, layer, dtheta, s);
  }
}

}  // namespace

struct GpuModel::Staging {
  int32_t* host[2] = {nullptr, nullptr};
  cudaEvent_t done[2] = {nullptr, nullptr};
  int64_t capacity = 0;  // int32 entries per slot (tokens then targets)
  int next = 0;
  float* loss_host = nullptr;
  ~Staging() {
    for (int i = 0; i < 2; ++i) {
      if (host[i]) cudaFreeHost(host[i]);
      if (done[i]) cudaEventDestroy(done[i]);
    }
    if (loss_host) cudaFreeHost(loss_host);
  }
};

GpuDecodeState::~GpuDecodeState() {
  if (pinned_) cudaFreeHost(pinned_);
}

// ---------------------------------------------------------------------------------------------
// Construction

GpuModel::GpuModel(model::ModelConfig cfg) : cfg_(std::move(cfg)) {
  QV_CHECK(device_count() > 0, "the GPU model needs a CUDA device, and none was found");
  register_backend();
  table_ = model::param_table(cfg_);
  stage_starts_ = model::backward_stage_starts(cfg_);
  const int64_t P = table_.empty() ? 0 : table_.back().offset + table_.back().numel;
  QV_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  params_ = Tensor::zeros({P}, DType::F32, Device::CUDA);
  grads_ = Tensor::zeros({P}, DType::F32, Device::CUDA);
  // The tied head's bf16 table has padded_vocab(V) rows, zero past V: the bf16 copy holds the
  // parameters in table order with that gap after tok_emb.
  const int64_t V = cfg_.vocab_size, D = cfg_.d_model;
  if (cfg_.tied_head)
    half_gap_ = model::align_param((padded_vocab(V) - V) * D);
  params_half_ = Tensor::zeros({P + half_gap_}, kBF16, Device::CUDA);
  loss_sum_ = Tensor::zeros({1}, DType::F32, Device::CUDA);
  staging_ = std::make_unique<Staging>();
  for (int i = 0; i < 2; ++i) QV_CUDA_CHECK(cudaEventCreateWithFlags(&staging_->done[i], cudaEventDisableTiming));
  QV_CUDA_CHECK(cudaMallocHost(&staging_->loss_host, sizeof(float)));

  std::map<std::string, size_t> index;
  for (size_t i = 0; i < table_.size(); ++i) index[table_[i].name] = i;
  auto get = [&](const std::string& name) {
    DeviceParam p;
    auto it = index.find(name);
    if (it == index.end()) return p;
    const model::ParamInfo& info = table_[it->second];
    const int64_t a = info.offset, e = info.offset + info.numel;
    p.master = params_.slice(0, a, e).reshape(info.shape);
    const int64_t gap = name == "tok_emb" ? 0 : half_gap_;
    p.half = params_half_.slice(0, a + gap, e + gap).reshape(info.shape);
    p.grad = grads_.slice(0, a, e).reshape(info.shape);
    return p;
  };
  for (int64_t l = 0; l < cfg_.n_layers; ++l) {
    auto L = std::make_unique<Layer>();
    model::bind_layer_params(*L, cfg_.pattern[l], l, get);
    L->givens_folded = L->theta.defined() && !cfg_.relation.raw_x;
    layers_.push_back(std::move(L));
  }
  tok_emb_ = get("tok_emb");
  if (cfg_.tied_head) tok_emb_.half = params_half_.slice(0, 0, padded_vocab(V) * D).reshape({padded_vocab(V), D});
  pos_emb_ = get("pos_emb");
  head_ = get("head");
  norm_f_w_ = get("norm_f.weight");
  norm_f_b_ = get("norm_f.bias");

  if (std::optional<model::FfnLaw> alg = model::ffn_law(cfg_)) {
    ffn_q_ = alg->law.q();
    ffn_schedule_ = alg->schedule;
    ffn_up_proj_ = std::make_unique<AlgProj>(alg->law, alg->up);
    ffn_down_proj_ = std::make_unique<AlgProj>(alg->law, alg->down);
  }
}

GpuModel::~GpuModel() {
  if (stream_) cudaStreamSynchronize(stream_);  // queued work may still use the buffers
  train_acts_.reset();
  infer_acts_.reset();
  if (stream_) cudaStreamDestroy(stream_);
}

void GpuModel::load_params(const Tensor& host) {
  check_shape(host, {num_params()}, "params");
  check_dtype(host, DType::F32, "params");
  QV_CUDA_CHECK(cudaStreamSynchronize(stream_));
  params_.copy_from(host);
  params_changed();
}

void GpuModel::store_params(Tensor& host) const {
  check_shape(host, {params_.numel()}, "params");
  check_dtype(host, DType::F32, "params");
  QV_CUDA_CHECK(cudaStreamSynchronize(stream_));
  host.copy_from(params_);
}

void GpuModel::params_changed() {
  if (half_gap_ == 0) {
    convert(params_, params_half_, stream_);
  } else {
    // tok_emb first, then everything after it past the zero rows.
    const int64_t emb = tok_emb_.master.numel(), P = params_.numel();
    Tensor half_emb = params_half_.slice(0, 0, emb), half_rest = params_half_.slice(0, emb + half_gap_, P + half_gap_);
    convert(params_.slice(0, 0, emb), half_emb, stream_);
    convert(params_.slice(0, emb, P), half_rest, stream_);
  }
  // The folded Givens mixing: the information projection's compute copy is the rotated weight.
  const int64_t H = cfg_.n_heads, Dh = cfg_.head_dim();
  for (int64_t l = 0; l < cfg_.n_layers; ++l) {
    Layer& L = *layers_[l];
    if (!L.givens_folded) continue;
    const DeviceParam& w = L.w_in[2];
    const Shape heads{w.master.numel() / (H * Dh), H, Dh};
    Tensor half = w.half.reshape(heads);
    givens_rotate_weight(w.master.reshape(heads), L.theta.master, l, half, stream_);
    if (L.b_in[2].defined()) {
      Tensor bias_half = L.b_in[2].half.reshape({H, Dh});
      givens_rotate_weight(L.b_in[2].master.reshape({H, Dh}), L.theta.master, l, bias_half, stream_);
    }
  }
}

void GpuModel::zero_grads() {
  QV_CUDA_CHECK(cudaMemsetAsync(grads_.raw(), 0, grads_.nbytes(), stream_));
}

// ---------------------------------------------------------------------------------------------
// Activations and token uploads

void GpuModel::ensure_acts(int64_t B, int64_t T, bool training) {
  QV_CHECK(B >= 1, "batch size must be ≥ 1, got {}", B);
  QV_CHECK(T >= 1 && T <= cfg_.context, "sequence length T = {} must be in [1, context = {}]", T, cfg_.context);
  std::unique_ptr<Acts>& slot = training ? train_acts_ : infer_acts_;
  if (slot && slot->B == B && slot->T == T) return;
  if (slot) {
    QV_CUDA_CHECK(cudaStreamSynchronize(stream_));  // the old buffers may still be in use
    slot.reset();
  }
  auto a = std::make_unique<Acts>();
  a->B = B;
  a->T = T;
  a->training = training;
  const int64_t N = B * T, D = cfg_.d_model, F = cfg_.ffn.width, H = cfg_.n_heads, Dh = cfg_.head_dim();
  const int64_t kv = cfg_.kv_heads() * Dh, V = cfg_.vocab_size;
  const bool swiglu = cfg_.ffn.kind == "swiglu";
  auto mat = [&](int64_t rows, int64_t cols) { return device_empty({rows, cols}, kBF16); };
  auto vec = [&](int64_t n) { return device_empty({n}, DType::F32); };

  auto make_slot = [&](const std::string& kinds) {
    LayerActs s;
    const bool has_a = kinds.find('A') != std::string::npos;
    const bool has_f = kinds.find('F') != std::string::npos;
    const bool has_l = kinds.find('L') != std::string::npos;
    const int64_t bc = has_a && !has_f && !has_l ? kv : D;
    s.x_in = mat(N, D);
    s.h1 = mat(N, D);
    s.mean1 = vec(N);
    s.rstd1 = vec(N);
    if (bc == D) {  // q, k, v (p1, p2, I) adjacent: one batched GEMM writes them
      std::vector<Tensor> abc = adjacent_mats(3, N, D);
      s.a = abc[0];
      s.b = abc[1];
      s.c = abc[2];
    } else {
      s.a = mat(N, D);
      s.b = mat(N, bc);
      s.c = mat(N, bc);
    }
    if ((has_f || has_l) && cfg_.relation.raw_x && cfg_.relation.givens && H > 1) s.mixed = mat(N, D);
    if (has_l) {
      s.gate = device_empty({N, D}, DType::F32);
      s.r_down = mat(N, Dh);
    }
    s.y = mat(N, D);
    if (has_a) s.lse = device_empty({B, H, T}, DType::F32);
    if (has_f) s.stats = device_empty({B, H, T, ops::kRelationStatCount}, DType::F32);
    s.x_mid = mat(N, D);
    s.h2 = mat(N, D);
    s.mean2 = vec(N);
    s.rstd2 = vec(N);
    if (swiglu) {  // gate and up adjacent: one batched GEMM writes them
      std::vector<Tensor> gate_up = adjacent_mats(2, N, F);
      s.f_gate = gate_up[0];
      s.f_up = gate_up[1];
    } else {
      s.f_up = mat(N, F);
    }
    s.f_act = mat(N, F);
    return s;
  };
  if (training)
    for (int64_t l = 0; l < cfg_.n_layers; ++l) a->layers.push_back(make_slot(std::string(1, cfg_.pattern[l])));
  else
    a->layers.push_back(make_slot(cfg_.pattern));
  a->tokens = device_ints(N);
  a->targets = device_ints(N);
  a->x_final = mat(N, D);
  a->hf = mat(N, D);
  a->mean_f = vec(N);
  a->rstd_f = vec(N);
  a->logits = mat(N, padded_vocab(V));
  a->row_loss = vec(N);
  a->loss = vec(1);
  a->last_x = mat(B, D);
  a->last_h = mat(B, D);
  a->last_mean = vec(B);
  a->last_rstd = vec(B);
  if (ffn_up_proj_) a->row_types = ffn_schedule_.batch_types(B, T, 0, ffn_q_);
  if (cfg_.pattern.find('L') != std::string::npos) {
    const int64_t bytes = linear_relation_workspace_bytes(B, T, H, Dh);
    a->lin_workspace = device_empty({std::max<int64_t>(1, (bytes + 3) / 4)}, DType::F32);
  }
  if (training) {
    a->dlogits = mat(N, padded_vocab(V));
    // The cross-entropy writes the [N, V] window; the padded columns stay zero, as the backward
    // head GEMMs, which run over all padded_vocab(V) columns, need.
    QV_CUDA_CHECK(cudaMemsetAsync(a->dlogits.raw(), 0, a->dlogits.nbytes(), stream_));
    if (cfg_.tied_head && padded_vocab(V) != V) a->head_dw = device_empty({padded_vocab(V), D}, DType::F32);
    for (Tensor* t : {&a->dx, &a->dh, &a->dtmp, &a->dy}) *t = mat(N, D);
    std::vector<Tensor> dabc = adjacent_mats(3, N, D);
    a->da = dabc[0];
    a->db = dabc[1];
    a->dc = dabc[2];
    if (cfg_.pattern.find('L') != std::string::npos) {
      a->dgate = device_empty({N, D}, DType::F32);
      a->dr = mat(N, D);
      a->dr_down = mat(N, Dh);
    }
    if (swiglu) {
      std::vector<Tensor> dgate_up = adjacent_mats(2, N, F);
      a->df_gate = dgate_up[0];
      a->df_up = dgate_up[1];
    } else {
      a->df_up = mat(N, F);
    }
    a->df_act = mat(N, F);
    for (const auto& L : layers_)
      if (L->givens_folded) {
        a->givens_base = device_empty({givens_scratch_numel(*L)}, DType::F32);
        break;
      }
    if (cfg_.pattern.find('F') != std::string::npos) {
      const int64_t bytes = flash_relation_backward_workspace_bytes(B, T, H);
      a->rel_workspace = device_empty({std::max<int64_t>(1, (bytes + 7) / 8)}, DType::F64);
    }
  }
  slot = std::move(a);
}

void GpuModel::upload_tokens(const int32_t* tokens, const int32_t* targets, int64_t n, Acts& acts) {
  const int64_t V = cfg_.vocab_size;
  for (int64_t i = 0; i < n; ++i) {
    QV_CHECK(tokens[i] >= 0 && tokens[i] < V, "token {} at index {} is outside the vocabulary [0, {})",
             tokens[i], i, V);
    if (targets)
      QV_CHECK(targets[i] < V, "target {} at index {} is outside the vocabulary [0, {})", targets[i], i, V);
  }
  Staging& st = *staging_;
  const int64_t need = 2 * n;
  if (need > st.capacity) {
    QV_CUDA_CHECK(cudaStreamSynchronize(stream_));
    for (int i = 0; i < 2; ++i) {
      if (st.host[i]) QV_CUDA_CHECK(cudaFreeHost(st.host[i]));
      QV_CUDA_CHECK(cudaMallocHost(&st.host[i], static_cast<size_t>(need) * sizeof(int32_t)));
    }
    st.capacity = need;
  }
  const int k = st.next;
  st.next = 1 - k;
  QV_CUDA_CHECK(cudaEventSynchronize(st.done[k]));  // the copy that last read this slot has run
  int32_t* h = st.host[k];
  std::memcpy(h, tokens, static_cast<size_t>(n) * sizeof(int32_t));
  const size_t bytes = static_cast<size_t>(n) * sizeof(int32_t);
  QV_CUDA_CHECK(cudaMemcpyAsync(acts.tokens.raw(), h, bytes, cudaMemcpyHostToDevice, stream_));
  if (targets) {
    std::memcpy(h + n, targets, bytes);
    QV_CUDA_CHECK(cudaMemcpyAsync(acts.targets.raw(), h + n, bytes, cudaMemcpyHostToDevice, stream_));
  }
  QV_CUDA_CHECK(cudaEventRecord(st.done[k], stream_));
}

// ---------------------------------------------------------------------------------------------
// Forward

namespace {

void norm_forward(const model::ModelConfig& cfg, const Tensor& x, const DeviceParam& w, const DeviceParam& b,
                  Tensor& y, Tensor& mean, Tensor& rstd, cudaStream_t s) {
  if (cfg.norm == "layernorm")
    layernorm_forward(x, w.master, b.master, cfg.norm_eps, y, mean, rstd, s);
  else
    rmsnorm_forward(x, w.master, cfg.norm_eps, y, rstd, s);
}

// dx assigned, or (accumulate_dx) the norm's gradient added to it: a residual branch's.
void norm_backward(const model::ModelConfig& cfg, const Tensor& dy, const Tensor& x, const DeviceParam& w,
                   const DeviceParam& b, const Tensor& mean, const Tensor& rstd, Tensor& dx, cudaStream_t s,
                   bool accumulate_dx = false) {
  Tensor gw = w.grad;
  if (cfg.norm == "layernorm") {
    Tensor gb = b.grad;
    layernorm_backward(dy, x, w.master, mean, rstd, dx, gw, gb, s, accumulate_dx);
  } else {
    rmsnorm_backward(dy, x, w.master, rstd, dx, gw, s, accumulate_dx);
  }
}

RelationKernelOptions relation_options(const model::ModelConfig& cfg) {
  RelationKernelOptions o;
  o.tau_s = static_cast<float>(cfg.relation.tau_s);
  o.exchange_only = cfg.relation.exchange_only;
  return o;
}

// An FFN projection: dense (with its bias) or algebraic with the rows' types; y assigned, or
// y += x W (accumulate).
void ffn_project(const Tensor& x, const DeviceParam& w, const DeviceParam& b, const AlgProj* alg,
                 const std::vector<int>& types, Tensor& y, bool accumulate, cudaStream_t s) {
  if (!alg) {
    project(x, w, b, y, accumulate ? 1.0f : 0.0f, s);
    return;
  }
  alg->forward(x, w.half, types, y, s, accumulate);
}

}  // namespace

// out += ffn(h): the gate and up projections into f_gate, f_up (with keep_projections), the
// activation into f_act, then the down projection added to out.
void GpuModel::ffn_forward(const Layer& L, const std::vector<int>& types, const Tensor& h, Tensor& f_gate,
                           Tensor& f_up, Tensor& f_act, Tensor& out, bool keep_projections) {
  const cudaStream_t s = stream_;
  const AlgProj* up = ffn_up_proj_.get();
  timer_.mark("ffn projections", s);
  if (cfg_.ffn.kind == "swiglu" && up && !keep_projections) {
    // Decoding: gate, up and SwiGLU in one few-row launch where it applies (AlgProj::forward_swiglu).
    up->forward_swiglu(h, L.ffn_gate.half, L.ffn_up.half, types, f_gate, f_up, f_act, s);
  } else if (cfg_.ffn.kind == "swiglu") {
    if (up) {  // one launch for both when decoding (AlgProj::forward_pair)
      up->forward_pair(h, L.ffn_gate.half, L.ffn_up.half, types, f_gate, f_up, s);
    } else {
      const DeviceParam w[2] = {L.ffn_gate, L.ffn_up}, b[2] = {L.ffn_gate_b, L.ffn_up_b};
      Tensor* gate_up[2] = {&f_gate, &f_up};
      project_many(h, w, b, gate_up, 2, s);
    }
    timer_.mark("activation", s);
    swiglu_forward(f_gate, f_up, f_act, s);
  } else {
    ffn_project(h, L.ffn_up, L.ffn_up_b, up, types, f_up, false, s);
    timer_.mark("activation", s);
    gelu_forward(f_up, f_act, s);
  }
  timer_.mark("ffn projections", s);
  ffn_project(f_act, L.ffn_down, L.ffn_down_b, ffn_down_proj_.get(), types, out, true, s);
}

void GpuModel::forward(Acts& A, Mode mode, GpuDecodeState* ds) {
  const int64_t B = A.B, T = A.T, N = B * T, D = cfg_.d_model, H = cfg_.n_heads, Dh = cfg_.head_dim();
  const int64_t Hkv = cfg_.kv_heads();
  const bool rope = cfg_.positions == "rope";
  const RelationKernelOptions rel_opts = relation_options(cfg_);
  const cudaStream_t s = stream_;
  const Shape hs{B, T, H, Dh};

  auto mark = [&](const char* label) { timer_.mark(label, s); };
  Tensor& x0 = A.slot(0).x_in;
  mark("embedding");
  detail::launch_embed(ints(A.tokens), N, T, f32(tok_emb_.master), rope ? nullptr : f32(pos_emb_.master), 0,
                       nullptr, D, bf16(x0), s);

  for (int64_t l = 0; l < cfg_.n_layers; ++l) {
    const Layer& L = *layers_[l];
    LayerActs& a = A.slot(l);
    mark("norm");
    norm_forward(cfg_, a.x_in, L.norm1_w, L.norm1_b, a.h1, a.mean1, a.rstd1, s);
    mark("mixer input projections");
    if (L.kind == 'A') {
      const int64_t kvw = Hkv * Dh;
      Tensor q = a.a, k = prefix(a.b, N, kvw), v = prefix(a.c, N, kvw);
      Tensor* qkv[3] = {&q, &k, &v};
      project_many(a.h1, L.w_in, L.b_in, qkv, 3, s);
      Tensor q4 = q.reshape(hs), k4 = k.reshape({B, T, Hkv, Dh}), v4 = v.reshape({B, T, Hkv, Dh});
      Tensor y4 = a.y.reshape(hs);
      mark("rope");
      if (rope) rope_pair(q4, k4, nullptr, false, cfg_.rope_base, s);
      mark("attention");
      attention_forward(q4, k4, v4, y4, a.lse, s);
      if (ds) {
        copy_into_cache(ds->cache_a_[l], k, B, T, s);
        copy_into_cache(ds->cache_b_[l], v, B, T, s);
      }
    } else {
      Tensor p1 = a.a, p2 = a.b, I = cfg_.relation.raw_x ? a.h1 : a.c;
      Tensor* outs[3] = {&p1, &p2, &I};
      project_many(a.h1, L.w_in, L.b_in, outs, cfg_.relation.raw_x ? 2 : 3, s);
      Tensor p14 = p1.reshape(hs), p24 = p2.reshape(hs), I4 = I.reshape(hs);
      mark("rope");
      if (rope) rope_pair(p14, p24, nullptr, false, cfg_.rope_base, s);
      Tensor mixed4 = I4;  // Ĩ: the projection's output when the mixing is folded
      if (L.theta.defined() && !L.givens_folded) {
        mark("givens");
        mixed4 = a.mixed.reshape(hs);
        givens_forward(I4, L.theta.master, l, mixed4, s);
      }
      Tensor y4 = a.y.reshape(hs);
      if (L.kind == 'F') {
        mark("flash relation");
        flash_relation_forward(p14, p24, mixed4, f32(L.lambda.master), y4, a.stats, rel_opts, s);
        if (ds) {
          copy_into_cache(ds->cache_a_[l], p2, B, T, s);
          copy_into_cache(ds->cache_b_[l], mixed4, B, T, s);
        }
      } else {
        Tensor g2 = a.gate;
        mark("retention gate");
        retention_gate_forward(a.h1, L.w_alpha_down.half, L.w_alpha_up.half, L.a_log.master, L.dt_bias.master,
                               a.r_down, g2, s);
        Tensor g4 = a.gate.reshape(hs);
        mark("linear relation");
        linear_relation_forward(p14, p24, mixed4, g4, y4, rel_opts.tau_s, A.lin_workspace,
                                ds ? &ds->state_[l] : nullptr, s);
      }
    }
    mark("residual copies");
    copy_async(a.x_mid, a.x_in, s);
    mark("mixer output projection");
    project(a.y, L.w_out, L.b_out, a.x_mid, 1.0f, s);

    mark("norm");
    norm_forward(cfg_, a.x_mid, L.norm2_w, L.norm2_b, a.h2, a.mean2, a.rstd2, s);
    // next = x_mid + ffn (next is this layer's x_in in the shared inference slot, free by now).
    Tensor& next = l + 1 < cfg_.n_layers ? A.slot(l + 1).x_in : A.x_final;
    mark("residual copies");
    copy_async(next, a.x_mid, s);
    ffn_forward(L, A.row_types, a.h2, a.f_gate, a.f_up, a.f_act, next);
  }

  mark("norm");
  if (mode == Mode::Prefill) {
    const size_t row = static_cast<size_t>(D) * 2;
    QV_CUDA_CHECK(cudaMemcpy2DAsync(A.last_x.raw(), row, bf16(A.x_final) + (T - 1) * D, T * row, row,
                                    static_cast<size_t>(B), cudaMemcpyDeviceToDevice, s));
    norm_forward(cfg_, A.last_x, norm_f_w_, norm_f_b_, A.last_h, A.last_mean, A.last_rstd, s);
    return;
  }
  norm_forward(cfg_, A.x_final, norm_f_w_, norm_f_b_, A.hf, A.mean_f, A.rstd_f, s);
  timer_.stop(s);
}

// logits [rows, V] (row stride ldc) = h [rows, D] · tok_embᵀ (tied) or h · W_head. A tied head
// writes all padded_vocab(V) columns (zero past V) when the rows have room for them.
void GpuModel::project_head(const Tensor& h, void* logits, int64_t ldc) const {
  const int64_t rows = h.dim(0), D = cfg_.d_model, V = cfg_.vocab_size;
  if (cfg_.tied_head)
    gemm(false, true, rows, ldc >= padded_vocab(V) ? padded_vocab(V) : V, D, 1.0f, h.raw(), kBF16, D,
         tok_emb_.half.raw(), kBF16, D, 0.0f, logits, kBF16, ldc, stream_);
  else
    gemm(false, false, rows, V, D, 1.0f, h.raw(), kBF16, D, head_.half.raw(), kBF16, V, 0.0f, logits, kBF16, ldc,
         stream_);
}

// The logits of the block's final hidden rows, then the loss (and dlogits when with_grad).
void GpuModel::head_and_loss(Acts& A, bool with_grad, float grad_scale) {
  const int64_t V = cfg_.vocab_size;
  Tensor logits = A.logits.slice(1, 0, V);
  timer_.mark("head", stream_);
  project_head(A.hf, A.logits.raw(), padded_vocab(V));
  timer_.mark("cross-entropy", stream_);
  Tensor dlogits = with_grad ? A.dlogits.slice(1, 0, V) : Tensor();
  cross_entropy(logits, ints(A.targets), grad_scale, A.row_loss, A.loss, with_grad ? &dlogits : nullptr, stream_);
  timer_.stop(stream_);
}

double GpuModel::forward_loss(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T) {
  ensure_acts(B, T, false);
  Acts& A = *infer_acts_;
  upload_tokens(tokens, targets, B * T, A);
  forward(A, Mode::Loss, nullptr);
  head_and_loss(A, false, 1.0f);
  QV_CUDA_CHECK(cudaMemcpyAsync(staging_->loss_host, A.loss.raw(), sizeof(float), cudaMemcpyDeviceToHost, stream_));
  QV_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return *staging_->loss_host;
}

Tensor GpuModel::forward_logits(const int32_t* tokens, int64_t B, int64_t T) {
  ensure_acts(B, T, false);
  Acts& A = *infer_acts_;
  upload_tokens(tokens, nullptr, B * T, A);
  forward(A, Mode::Logits, nullptr);
  const int64_t V = cfg_.vocab_size, Vp = padded_vocab(V);
  project_head(A.hf, A.logits.raw(), Vp);
  Tensor host = Tensor::empty({B * T, V}, kBF16);
  QV_CUDA_CHECK(cudaMemcpy2DAsync(host.raw(), V * 2, A.logits.raw(), Vp * 2, V * 2, static_cast<size_t>(B * T),
                                  cudaMemcpyDeviceToHost, stream_));
  QV_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return host.to(DType::F32).reshape({B, T, V});
}

// ---------------------------------------------------------------------------------------------
// Backward

void GpuModel::backward(Acts& A, const GradientsFinal& on_final) {
  const int64_t B = A.B, T = A.T, N = B * T, D = cfg_.d_model, H = cfg_.n_heads, Dh = cfg_.head_dim();
  const int64_t Hkv = cfg_.kv_heads(), V = cfg_.vocab_size;
  const bool rope = cfg_.positions == "rope";
  const RelationKernelOptions rel_opts = relation_options(cfg_);
  const cudaStream_t s = stream_;
  const Shape hs{B, T, H, Dh};
  const AlgProj* up = ffn_up_proj_.get();
  const AlgProj* down = ffn_down_proj_.get();
  const std::vector<int>& types = A.row_types;

  auto mark = [&](const char* label) { timer_.mark(label, s); };
  size_t stage = 0;  // the next entry of stage_starts_ to report
  auto stage_done = [&] {
    if (on_final) on_final(stage_starts_.at(stage));
    ++stage;
  };
  mark("bwd head");
  const int64_t Vp = padded_vocab(V);
  if (cfg_.tied_head) {
    // Over all Vp columns: dlogits is zero past V, and so are the padded rows of the table.
    gemm(false, false, N, D, Vp, 1.0f, A.dlogits.raw(), kBF16, Vp, tok_emb_.half.raw(), kBF16, D, 0.0f, A.dh.raw(),
         kBF16, D, s);
    if (Vp == V) {
      gemm(true, false, V, D, N, 1.0f, A.dlogits.raw(), kBF16, Vp, A.hf.raw(), kBF16, D, 1.0f, tok_emb_.grad.raw(),
           DType::F32, D, s);
    } else {  // an aligned product into [Vp, D], then its first V rows added to the gradient
      gemm(true, false, Vp, D, N, 1.0f, A.dlogits.raw(), kBF16, Vp, A.hf.raw(), kBF16, D, 0.0f, A.head_dw.raw(),
           DType::F32, D, s);
      detail::launch_add_f32(f32(tok_emb_.grad), f32(A.head_dw), V * D, s);
    }
  } else {
    gemm(false, true, N, D, V, 1.0f, A.dlogits.raw(), kBF16, Vp, head_.half.raw(), kBF16, V, 0.0f, A.dh.raw(),
         kBF16, D, s);
    gemm(true, false, D, V, N, 1.0f, A.hf.raw(), kBF16, D, A.dlogits.raw(), kBF16, Vp, 1.0f, head_.grad.raw(),
         DType::F32, V, s);
  }
  mark("bwd norm");
  norm_backward(cfg_, A.dh, A.x_final, norm_f_w_, norm_f_b_, A.mean_f, A.rstd_f, A.dx, s);
  stage_done();  // the head and the final norm

  // Backward of an FFN projection into dx (assigned, or accumulated through dtmp).
  auto ffn_back = [&](const Tensor& dy, const Tensor& x, const DeviceParam& w, const DeviceParam& b,
                      const AlgProj* alg, Tensor& dx, bool accumulate) {
    if (!alg) {
      project_backward(dy, x, w, b, &dx, accumulate ? 1.0f : 0.0f, s);
      return;
    }
    Tensor target = accumulate ? prefix(A.dtmp, dx.dim(0), dx.dim(1)) : dx;
    Tensor dw = w.grad.reshape(w.half.shape());
    alg->backward(x, w.half, dy, types, &target, &dw, s, /*accumulate_dw=*/true);
    if (accumulate) detail::launch_add_bf16(bf16(dx), bf16(target), dx.numel(), s);
  };

  for (int64_t l = cfg_.n_layers - 1; l >= 0; --l) {
    const Layer& L = *layers_[l];
    LayerActs& a = A.slot(l);

    // FFN: A.dx holds d x_next.
    mark("bwd ffn projections");
    ffn_back(A.dx, a.f_act, L.ffn_down, L.ffn_down_b, down, A.df_act, false);
    if (cfg_.ffn.kind == "swiglu") {
      mark("bwd activation");
      swiglu_backward(A.df_act, a.f_gate, a.f_up, A.df_gate, A.df_up, s);
      mark("bwd ffn projections");
      if (up) {
        ffn_back(A.df_gate, a.h2, L.ffn_gate, L.ffn_gate_b, up, A.dh, false);
        ffn_back(A.df_up, a.h2, L.ffn_up, L.ffn_up_b, up, A.dh, true);
      } else {
        const DeviceParam w[2] = {L.ffn_gate, L.ffn_up}, b[2] = {L.ffn_gate_b, L.ffn_up_b};
        const Tensor* dgate_up[2] = {&A.df_gate, &A.df_up};
        project_many_backward(dgate_up, a.h2, w, b, 2, A.dh, s);
      }
    } else {
      mark("bwd activation");
      gelu_backward(A.df_act, a.f_up, A.df_up, s);
      mark("bwd ffn projections");
      ffn_back(A.df_up, a.h2, L.ffn_up, L.ffn_up_b, up, A.dh, false);
    }
    mark("bwd norm");
    norm_backward(cfg_, A.dh, a.x_mid, L.norm2_w, L.norm2_b, a.mean2, a.rstd2, A.dx, s, true);  // d x_mid

    // Mixer: x_mid = x_in + y W_O (+ b_O).
    mark("bwd mixer projections");
    project_backward(A.dx, a.y, L.w_out, L.b_out, &A.dy, 0.0f, s);
    if (L.kind == 'A') {
      const int64_t kvw = Hkv * Dh;
      Tensor dk = prefix(A.db, N, kvw), dv = prefix(A.dc, N, kvw);
      Tensor q4 = a.a.reshape(hs), k4 = prefix(a.b, N, kvw).reshape({B, T, Hkv, Dh});
      Tensor v4 = prefix(a.c, N, kvw).reshape({B, T, Hkv, Dh});
      Tensor dq4 = A.da.reshape(hs), dk4 = dk.reshape({B, T, Hkv, Dh}), dv4 = dv.reshape({B, T, Hkv, Dh});
      mark("bwd attention");
      attention_backward(q4, k4, v4, a.y.reshape(hs), a.lse, A.dy.reshape(hs), dq4, dk4, dv4, s);
      mark("bwd rope");
      if (rope) rope_pair(dq4, dk4, nullptr, true, cfg_.rope_base, s);
      mark("bwd mixer projections");
      const Tensor* dqkv[3] = {&A.da, &dk, &dv};
      project_many_backward(dqkv, a.h1, L.w_in, L.b_in, 3, A.dh, s);
    } else {
      Tensor I = cfg_.relation.raw_x ? a.h1 : a.c;
      Tensor p14 = a.a.reshape(hs), p24 = a.b.reshape(hs), I4 = I.reshape(hs);
      const bool rotate_states = L.theta.defined() && !L.givens_folded;
      Tensor mixed4 = rotate_states ? a.mixed.reshape(hs) : I4;
      // dĨ (then dI) in dc, next to dp1 and dp2 for the batched weight gradients.
      Tensor dp14 = A.da.reshape(hs), dp24 = A.db.reshape(hs), dmixed4 = A.dc.reshape(hs);
      Tensor y4 = a.y.reshape(hs), dy4 = A.dy.reshape(hs);
      if (L.kind == 'F') {
        mark("bwd flash relation");
        float* dlambda = cfg_.relation.lambda_frozen ? nullptr : f32(L.lambda.grad);
        flash_relation_backward(p14, p24, mixed4, f32(L.lambda.master), y4, a.stats, dy4, dp14, dp24, dmixed4,
                                dlambda, rel_opts, A.rel_workspace, s);
      } else {
        Tensor g4 = a.gate.reshape(hs), dg4 = A.dgate.reshape(hs);
        mark("bwd linear relation");
        linear_relation_backward(p14, p24, mixed4, g4, dy4, dp14, dp24, dmixed4, dg4, rel_opts.tau_s,
                                 A.lin_workspace, s);
      }
      Tensor dI4 = dmixed4;
      if (rotate_states) {
        mark("bwd givens");
        Tensor dtheta = L.theta.grad;
        givens_backward(dmixed4, I4, L.theta.master, l, dI4, dtheta, s);
      }
      mark("bwd rope");
      if (rope) rope_pair(dp14, dp24, nullptr, true, cfg_.rope_base, s);
      mark("bwd mixer projections");
      // Folded mixing: the projection's backward leaves dW̃ in W_I's gradient (emptied for it,
      // the earlier micro-batches' sum kept aside), then dW_I = that sum + Gᵀ dW̃ and dθ.
      Tensor givens_base[2];
      if (L.givens_folded) givens_set_aside(L, A.givens_base, givens_base, s);
      const Tensor* dp[3] = {&A.da, &A.db, &A.dc};
      project_many_backward(dp, a.h1, L.w_in, L.b_in, cfg_.relation.raw_x ? 2 : 3, A.dh, s);
      if (L.givens_folded) {
        mark("bwd givens (weights)");
        givens_fold_backward(L, l, H, Dh, givens_base, s);
        mark("bwd mixer projections");
      }
      if (cfg_.relation.raw_x) detail::launch_add_bf16(bf16(A.dh), bf16(A.dc), N * D, s);
      if (L.kind == 'L') {
        Tensor dg2 = A.dgate, dwd = L.w_alpha_down.grad, dwu = L.w_alpha_up.grad;
        Tensor dal = L.a_log.grad, ddt = L.dt_bias.grad;
        mark("bwd retention gate");
        retention_gate_backward(a.h1, L.w_alpha_down.half, L.w_alpha_up.half, L.a_log.master, L.dt_bias.master,
                                a.r_down, dg2, A.dh, dwd, dwu, dal, ddt, A.dr, A.dr_down, s);
      }
    }
    mark("bwd norm");
    norm_backward(cfg_, A.dh, a.x_in, L.norm1_w, L.norm1_b, a.mean1, a.rstd1, A.dx, s, true);  // d x_in
    stage_done();  // layer l
  }
  mark("bwd embedding");

  Tensor demb = tok_emb_.grad;
  embedding_backward_accumulate(ints(A.tokens), N, A.dx, demb, s);
  if (!rope) detail::launch_position_backward(bf16(A.dx), B, T, D, f32(pos_emb_.grad), s);
  timer_.stop(s);
  stage_done();  // the embeddings
  QV_CHECK(stage == stage_starts_.size(), "GpuModel::backward reported {} of its {} stages", stage,
           stage_starts_.size());
}

void GpuModel::forward_backward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T,
                                float grad_scale, const GradientsFinal& on_final) {
  ensure_acts(B, T, true);
  Acts& A = *train_acts_;
  upload_tokens(tokens, targets, B * T, A);
  forward(A, Mode::Train, nullptr);
  head_and_loss(A, true, grad_scale);
  detail::launch_add_f32(f32(loss_sum_), f32(A.loss), 1, stream_);
  backward(A, on_final);
}

double GpuModel::take_loss_sum() {
  QV_CUDA_CHECK(cudaMemcpyAsync(staging_->loss_host, loss_sum_.raw(), sizeof(float), cudaMemcpyDeviceToHost, stream_));
  QV_CUDA_CHECK(cudaMemsetAsync(loss_sum_.raw(), 0, sizeof(float), stream_));
  QV_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return *staging_->loss_host;
}

// ---------------------------------------------------------------------------------------------
// Decoding

std::unique_ptr<GpuDecodeState> GpuModel::new_decode_state(int64_t B, int64_t capacity) {
  QV_CHECK(B >= 1, "decode batch must be ≥ 1, got {}", B);
  QV_CHECK(capacity >= 1, "decode capacity must be ≥ 1, got {}", capacity);
  if (cfg_.positions == "learned")
    QV_CHECK(capacity <= cfg_.context, "decode capacity {} exceeds the context {} of a model with learned positions",
             capacity, cfg_.context);
  std::unique_ptr<GpuDecodeState> st(new GpuDecodeState());
  st->owner_ = this;
  st->B_ = B;
  st->cap_ = capacity;
  const int64_t D = cfg_.d_model, H = cfg_.n_heads, Dh = cfg_.head_dim(), F = cfg_.ffn.width;
  const int64_t Hkv = cfg_.kv_heads();
  st->cache_a_.resize(cfg_.n_layers);
  st->cache_b_.resize(cfg_.n_layers);
  st->state_.resize(cfg_.n_layers);
  for (int64_t l = 0; l < cfg_.n_layers; ++l) {
    const char kind = cfg_.pattern[l];
    if (kind == 'L') {
      st->state_[l] = Tensor::zeros({B, H, Dh, Dh}, DType::F32, Device::CUDA);
    } else {
      const int64_t heads = kind == 'A' ? Hkv : H;
      st->cache_a_[l] = device_empty({B, capacity, heads, Dh}, kBF16);
      st->cache_b_[l] = device_empty({B, capacity, heads, Dh}, kBF16);
    }
  }
  for (Tensor* t : {&st->x_, &st->h_, &st->mixed_, &st->y_}) *t = device_empty({B, D}, kBF16);
  std::vector<Tensor> abc = adjacent_mats(3, B, D);  // one batched GEMM writes q, k, v (p1, p2, I)
  st->a_ = abc[0];
  st->b_ = abc[1];
  st->c_ = abc[2];
  st->mean_ = device_empty({B}, DType::F32);
  st->rstd_ = device_empty({B}, DType::F32);
  st->gate_ = device_empty({B, D}, DType::F32);
  st->r_down_ = device_empty({B, Dh}, kBF16);
  std::vector<Tensor> gate_up = adjacent_mats(2, B, F);
  st->f_gate_ = gate_up[0];
  st->f_up_ = gate_up[1];
  st->f_act_ = device_empty({B, F}, kBF16);
  st->logits_ = device_empty({B, cfg_.vocab_size}, kBF16);
  st->pos_dev_ = Tensor::zeros({1}, DType::F32, Device::CUDA);
  st->tokens_ = Tensor::zeros({B}, DType::F32, Device::CUDA);
  st->row_types_.assign(static_cast<size_t>(B), 0);
  QV_CUDA_CHECK(cudaMallocHost(&st->pinned_, sizeof(int32_t) * static_cast<size_t>(B + 1)));
  return st;
}

void GpuModel::prefill(GpuDecodeState& st, const int32_t* tokens, int64_t B, int64_t T) {
  QV_CHECK(st.owner_ == this, "decode state was not made by this model (new_decode_state)");
  QV_CHECK(B == st.B_, "prefill: the decode state holds {} sequences, got B = {}", st.B_, B);
  QV_CHECK(T >= 1, "prefill: needs at least one token, got T = {}", T);
  QV_CHECK(st.pos_ + T <= st.cap_, "prefill: {} + {} tokens exceed the decode capacity {}", st.pos_, T, st.cap_);
  if (st.pos_ > 0 || T > cfg_.context) {
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t b = 0; b < B; ++b) {
        const int32_t id = tokens[b * T + t];
        QV_CHECK(id >= 0 && id < cfg_.vocab_size, "token {} is outside the vocabulary [0, {})", id, cfg_.vocab_size);
        st.pinned_[b] = id;
      }
      QV_CUDA_CHECK(cudaMemcpyAsync(st.tokens(), st.pinned_, sizeof(int32_t) * B, cudaMemcpyHostToDevice, stream_));
      decode_step(st);
      QV_CUDA_CHECK(cudaStreamSynchronize(stream_));  // the staging row is reused next
    }
    return;
  }
  ensure_acts(B, T, false);
  Acts& A = *infer_acts_;
  upload_tokens(tokens, nullptr, B * T, A);
  forward(A, Mode::Prefill, &st);
  project_head(A.last_h, st.logits_.raw(), cfg_.vocab_size);
  st.pinned_[B] = static_cast<int32_t>(T);
  QV_CUDA_CHECK(cudaMemcpyAsync(st.device_position(), st.pinned_ + B, sizeof(int32_t), cudaMemcpyHostToDevice,
                                stream_));
  QV_CUDA_CHECK(cudaStreamSynchronize(stream_));
  st.pos_ = T;
}

int GpuModel::decode_row_type(int64_t position) const {
  return ffn_up_proj_ ? ffn_schedule_.type_of(position, ffn_q_) : 0;
}

void GpuModel::decode_step(GpuDecodeState& st) {
  QV_CHECK(st.owner_ == this, "decode state was not made by this model (new_decode_state)");
  QV_CHECK(st.pos_ < st.cap_, "decode_step: the decode state is full ({} positions)", st.cap_);
  const int64_t B = st.B_, D = cfg_.d_model, H = cfg_.n_heads, Dh = cfg_.head_dim(), Hkv = cfg_.kv_heads();
  const int64_t V = cfg_.vocab_size;
  const bool rope = cfg_.positions == "rope";
  const RelationKernelOptions rel_opts = relation_options(cfg_);
  const cudaStream_t s = stream_;
  const int32_t* pos = st.device_position();
  std::fill(st.row_types_.begin(), st.row_types_.end(), decode_row_type(st.pos_));
  const Shape rows{B, H, Dh};

  auto mark = [&](const char* label) { timer_.mark(label, s); };
  mark("embedding");
  detail::launch_embed(st.tokens(), B, 1, f32(tok_emb_.master), rope ? nullptr : f32(pos_emb_.master), 0, pos, D,
                       bf16(st.x_), s);
  for (int64_t l = 0; l < cfg_.n_layers; ++l) {
    const Layer& L = *layers_[l];
    mark("norm");
    norm_forward(cfg_, st.x_, L.norm1_w, L.norm1_b, st.h_, st.mean_, st.rstd_, s);
    mark("mixer input projections");
    if (L.kind == 'A') {
      const int64_t kvw = Hkv * Dh;
      Tensor k = prefix(st.b_, B, kvw), v = prefix(st.c_, B, kvw);
      Tensor* qkv[3] = {&st.a_, &k, &v};
      project_many(st.h_, L.w_in, L.b_in, qkv, 3, s);
      Tensor q3 = st.a_.reshape(rows), k3 = k.reshape({B, Hkv, Dh}), v3 = v.reshape({B, Hkv, Dh});
      mark("rope");
      if (rope) rope_pair(q3, k3, pos, false, cfg_.rope_base, s);
      Tensor y3 = st.y_.reshape(rows);
      mark("attention");
      attention_decode_step(q3, k3, v3, st.cache_a_[l], st.cache_b_[l], pos, y3, s);
    } else {
      Tensor I = cfg_.relation.raw_x ? st.h_ : st.c_;
      Tensor* outs[3] = {&st.a_, &st.b_, &I};
      project_many(st.h_, L.w_in, L.b_in, outs, cfg_.relation.raw_x ? 2 : 3, s);
      Tensor p13 = st.a_.reshape(rows), p23 = st.b_.reshape(rows), I3 = I.reshape(rows);
      mark("rope");
      if (rope) rope_pair(p13, p23, pos, false, cfg_.rope_base, s);
      Tensor mixed3 = I3;
      if (L.theta.defined() && !L.givens_folded) {
        mixed3 = st.mixed_.reshape(rows);
        givens_forward(I3, L.theta.master, l, mixed3, s);
      }
      Tensor y3 = st.y_.reshape(rows);
      mark("relation / linear relation");
      if (L.kind == 'F') {
        relation_decode_step(p13, p23, mixed3, f32(L.lambda.master), st.cache_a_[l], st.cache_b_[l], pos, y3,
                             rel_opts, s);
      } else {
        Tensor g2 = st.gate_;
        retention_gate_forward(st.h_, L.w_alpha_down.half, L.w_alpha_up.half, L.a_log.master, L.dt_bias.master,
                               st.r_down_, g2, s);
        Tensor g3 = st.gate_.reshape(rows);
        linear_relation_decode_step(p13, p23, mixed3, g3, st.state_[l], y3, rel_opts.tau_s, s);
      }
    }
    mark("mixer output projection");
    project(st.y_, L.w_out, L.b_out, st.x_, 1.0f, s);  // x += y W_O (in place: C = D = x)
    mark("norm");
    norm_forward(cfg_, st.x_, L.norm2_w, L.norm2_b, st.h_, st.mean_, st.rstd_, s);
    ffn_forward(L, st.row_types_, st.h_, st.f_gate_, st.f_up_, st.f_act_, st.x_, false);
  }
  mark("norm");
  norm_forward(cfg_, st.x_, norm_f_w_, norm_f_b_, st.h_, st.mean_, st.rstd_, s);
  mark("head");
  project_head(st.h_, st.logits_.raw(), V);
  detail::launch_increment(st.device_position(), s);
  timer_.stop(s);
  st.pos_ += 1;
}

}  // namespace quiver::cuda

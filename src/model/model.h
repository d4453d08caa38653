// The decoder-only language model on the CPU: explicit forward and backward per layer
// (as llm.c), parameters and gradients each in one contiguous buffer, activations
// preallocated for the last (B, T) shape and reused.
//
// Structure (pre-norm): x = tok_emb[tokens] (+ pos_emb[p] when positions = learned); each
// layer ℓ: x += mixer_ℓ(norm1(x)); x += ffn(norm2(x)); then the final norm and
// logits = x · tok_embᵀ (tied head) or x · head [D, V].
//   A (attention): q, k, v = h W_q, h W_k, h W_v (GQA widths), RoPE on q, k, causal attention, out W_o.
//   F (Full Relation, SPEC §2.1–2.3): p1, p2, I = h W_1, h W_2, h W_I (or I = h with raw_x); RoPE
//     on p1, p2; Givens mixing of I (pairing by ℓ); FlashRelation with the layer's λ; out W_O.
//   L (Linear Relation, SPEC §2.4): the same projections, RoPE and Givens; the retention gate on
//     h; the chunked recurrence (chunk 64); out W_O.
//   FFN: swiglu a = silu(h2 W_gate) ⊙ (h2 W_up), gelu a = gelu(h2 W_up); out = a W_down. Each
//     projection is a dense matmul, or an algebraic projection (ops::AlgProj) whose row types
//     come from the absolute positions through the schedule (decoding continues them).
//
// Parameter names (ParamInfo::name), per layer ℓ under "layers.ℓ.":
//   tok_emb [V, D], pos_emb [context, D] (learned positions), head [D, V] (untied),
//   norm_f.weight [D], norm_f.bias [D] (layernorm); layers.ℓ.norm1.{weight,bias}, layers.ℓ.norm2.{weight,bias};
//   A: mixer.wq [D, H·Dh], mixer.wk, mixer.wv [D, Hkv·Dh], mixer.wo [D, D], with attn_bias also
//      mixer.bq, mixer.bk, mixer.bv, mixer.bo;
//   F, L: mixer.w1, mixer.w2 [D, D], mixer.wi [D, D] (not with raw_x), mixer.wo [D, D], with attn_bias
//      mixer.b1, mixer.b2, mixer.bi, mixer.bo; mixer.theta [H/2] (Givens, H > 1);
//   F: mixer.lambda [1];  L: mixer.w_alpha_down [D, Dh], mixer.w_alpha_up [Dh, H·Dh], mixer.a_log [H],
//      mixer.dt_bias [H·Dh];
//   ffn.gate [D, F] (swiglu), ffn.up [D, F], ffn.down [F, D], with ffn.bias also ffn.gate_bias,
//      ffn.up_bias [F], ffn.down_bias [D].
//
// Gradient contract: every backward ACCUMULATES into grads() (+=); the caller zeros grads()
// once per update, so micro-batches add up. A frozen λ never receives a gradient.
//
// A Model owns its activation buffers, so one Model serves one thread at a time; decode states
// hold their own caches and rows, but a step runs through the Model's parameters and BLAS.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "algebra/law.h"
#include "model/config.h"
#include "quiver/tensor.h"

namespace quiver::ops {
class AlgProj;
}

namespace quiver::model {

// Every parameter starts at a multiple of kParamAlign elements of the flat buffers (256 bytes
// of fp32, 128 of a bf16 copy), so views of it are aligned for vector loads and tensor-core
// GEMMs: a one-element λ before a layer's matrices would otherwise leave them 2-byte aligned,
// which cuBLASLt serves with far slower kernels. The gaps hold zeros and belong to no
// parameter (no segment of the optimizer, no checkpoint tensor).
constexpr int64_t kParamAlign = 64;
constexpr int64_t align_param(int64_t n) { return (n + kParamAlign - 1) / kParamAlign * kParamAlign; }

struct ParamInfo {
  std::string name;
  Shape shape;
  int64_t offset = 0;       // first element in params() / grads(), a multiple of kParamAlign
  int64_t numel = 0;
  // Weight decay applies: true for 2-D weight matrices, the embeddings included (as GPT-2
  // and llm.c do); false for norms, biases, λ, θ, A_log and dt_bias.
  bool decay = false;
  // "embedding", "attention", "relation", "linear_relation", "ffn", "norm", "head".
  std::string group;
  // False only for a frozen λ (relation.lambda_frozen): the optimizer must leave it unchanged
  // and its gradient stays zero.
  bool trainable = true;
};

// Per-layer decode caches (KV for A, Relation Cache for F, the linear state for L), the
// position, and the step's preallocated rows. Opaque: made by Model::new_decode_state.
class DecodeState {
 public:
  virtual ~DecodeState();
  virtual int64_t batch() const = 0;
  virtual int64_t capacity() const = 0;   // positions the caches hold
  virtual int64_t position() const = 0;   // tokens consumed so far

 protected:
  DecodeState() = default;
};

class Model {
 public:
  // Builds the parameter table; params and grads are zeroed buffers of `dtype` (F32, or F64
  // for the whole-model finite-difference tests). Validates the config.
  explicit Model(ModelConfig cfg, DType dtype = DType::F32);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  // Deterministic from the seed: matrices and embeddings N(0, init_std), the residual output
  // projections (mixer.wo, ffn.down) N(0, init_std / sqrt(2 n_layers)); norm weights 1, biases 0;
  // λ = lambda_init; θ = 0; A_log = log U(1, 16); dt_bias = softplus⁻¹(dt), dt log-uniform in
  // [1e-3, 1e-1].
  void init(uint64_t seed);

  const ModelConfig& config() const { return cfg_; }
  DType dtype() const { return dtype_; }
  Tensor& params() { return params_; }   // flat [P], CPU
  Tensor& grads() { return grads_; }     // flat [P], CPU
  const std::vector<ParamInfo>& param_table() const { return table_; }
  const ParamInfo& param_info(const std::string& name) const;  // throws naming the tensor
  Tensor param(const std::string& name) const;   // view into params() with the recorded shape
  Tensor grad(const std::string& name) const;    // view into grads()
  int64_t num_params() const { return params_.numel(); }  // flat length, alignment gaps included

  // tokens, targets: B·T int32, row-major; 1 ≤ T ≤ context; a target < 0 is ignored.
  // Returns the mean cross-entropy over the non-ignored targets.
  // forward_backward ADDS grad_scale · dLoss/dθ into grads().
  double forward_backward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T,
                          float grad_scale);
  double forward_loss(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T);
  // logits [B, T, V] of the model dtype (allocated when undefined, else checked).
  void forward_logits(const int32_t* tokens, int64_t B, int64_t T, Tensor& logits);

  // Decoding with caches; absolute positions (and so RoPE angles and algebraic row types)
  // continue from the prefill. capacity ≤ context with learned positions.
  std::unique_ptr<DecodeState> new_decode_state(int64_t B, int64_t capacity) const;
  // Consumes T tokens per sequence ([B, T] row-major); logits [B, V] of the last position.
  // On a fresh state it runs the parallel forward and fills the caches; on a state that has
  // already consumed tokens it continues one token at a time (same result).
  void prefill(DecodeState& s, const int32_t* tokens, int64_t B, int64_t T, Tensor& logits);
  // One token per sequence; logits [B, V]. Allocates nothing.
  void decode_step(DecodeState& s, const int32_t* tokens /*[B]*/, Tensor& logits /*[B,V]*/);
  int64_t position(const DecodeState& s) const { return s.position(); }

  // Implementation types, defined in model.cpp.
  struct Layer;
  struct Activations;

 private:
  enum class Mode { Loss, Train, Logits, Prefill };
  // Runs the layers and the final norm into the activations (train: per-layer slots kept for
  // backward; prefill: also fills the decode caches and normalizes only the last position).
  void forward(const int32_t* tokens, int64_t B, int64_t T, Mode mode, DecodeState* state);
  // From the cross-entropy's dlogits in the training activations; accumulates into grads().
  void backward(const int32_t* tokens, int64_t B, int64_t T);
  void ensure_activations(int64_t B, int64_t T, bool training);
  void project_head(const Tensor& h, Tensor& logits) const;

  ModelConfig cfg_;
  DType dtype_;
  std::vector<ParamInfo> table_;
  Tensor params_, grads_;
  std::vector<std::unique_ptr<Layer>> layers_;
  // Views of the parameters outside the layers (undefined when the config has none).
  Tensor tok_emb_, tok_emb_grad_, pos_emb_, pos_emb_grad_, head_, head_grad_;
  Tensor norm_f_w_, norm_f_w_grad_, norm_f_b_, norm_f_b_grad_;
  // Algebraic FFN (null for the dense law): D → F for gate and up, F → D for down.
  std::unique_ptr<ops::AlgProj> ffn_up_proj_, ffn_down_proj_;
  algebra::Schedule ffn_schedule_;
  int ffn_q_ = 1;
  // The last shape's buffers, kept separately for training and for inference/decoding.
  std::unique_ptr<Activations> train_acts_, infer_acts_;
};

// The parameter table of a config, and its parameter count (Σ numel, without the alignment
// gaps), without allocating the model.
std::vector<ParamInfo> param_table(const ModelConfig& cfg);
int64_t count_params(const ModelConfig& cfg);

// The stages in which the backward finishes the parameter gradients, in the order it runs
// them: the head and the final norm, then each layer from the last to the first, then the
// embeddings (n_layers + 2 stages). Entry s is the first table index of stage s; a stage's
// parameters are contiguous in the table and the stages run from its end to its start, so after
// stage s every entry from starts[s] on has its final gradient. (A tied head adds to tok_emb's
// gradient in the first stage; it is final only after the last.) The GPU model reports these
// points to its caller as its backward reaches them (cuda/model.h).
std::vector<size_t> backward_stage_starts(const ModelConfig& cfg);

}  // namespace quiver::model

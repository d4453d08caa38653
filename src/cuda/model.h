// The decoder-only language model on the GPU: the CUDA twin of model::Model (src/model/model.h),
// with the same structure, parameter table and names, so that CPU and GPU runs read and write
// the same checkpoints.
//
// Precision policy (shared/DESIGN.md), in one place:
//   - master parameters, their gradients and the optimizer state are fp32, each one flat
//     buffer on the device in the order of model::param_table;
//   - a bf16 copy of the parameters (refreshed by params_changed()) feeds the GEMMs and the
//     bias epilogues; norms, embeddings, λ, θ, A_log and dt_bias read the fp32 masters. With a
//     tied head the copy of tok_emb has padded_vocab(V) rows (a multiple of 64; the rows past
//     V are zero) so that the head GEMMs are aligned in every dimension;
//   - activations and their gradients are bf16, every product and sum accumulates in fp32
//     (cuBLASLt CUBLAS_COMPUTE_32F, fp32 kernel arithmetic), Linear Relation's decay g and
//     state are fp32, the loss is fp32.
//
// Streams and synchronization: everything runs on the model's one stream. A training step
// (forward_backward for each micro-batch, then the optimizer on grads()) makes no host
// synchronization: token uploads go through pinned staging buffers, the loss is summed on the
// device and read once per step by take_loss_sum(). Activations are allocated once per (B, T)
// shape and reused; a new shape frees the old buffers first.
//
// Gradient contract (as the CPU model): forward_backward ACCUMULATES grad_scale · dLoss/dθ into
// grads(); zero_grads() clears them once per update. A frozen λ receives no gradient. The
// backward finishes the gradients in the stages of model::backward_stage_starts and tells its
// caller as it enqueues the end of each one (GradientsFinal), so that a data-parallel engine can
// start reducing finished gradients on another stream while the backward goes on.
//
// Decoding: new_decode_state() allocates the caches (KV for A, the Relation Cache for F, the
// fp32 state C for L) and the step's rows; prefill() runs the parallel forward over the prompt
// and fills the caches; decode_step() consumes one token per sequence from device memory and
// writes the next logits. The position lives in device memory and is advanced by the step
// itself, so the step can be captured once in a CUDA graph and replayed at every position
// (the generator in cuda/generate.h does this, one graph per algebraic row type).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include <cuda_runtime.h>

#include "algebra/law.h"
#include "model/config.h"
#include "model/model.h"
#include "cuda/op_timer.h"
#include "quiver/tensor.h"

namespace quiver::cuda {

class AlgProj;

// A parameter on the device: the fp32 master, its bf16 copy and its fp32 gradient (views into
// the flat buffers); undefined when the config has no such tensor. The tied tok_emb's half is
// [padded_vocab(V), D] (the model file comment).
struct DeviceParam {
  Tensor master, half, grad;
  bool defined() const { return master.defined(); }
};

class GpuDecodeState;

class GpuModel {
 public:
  // Builds the parameter table of `cfg` (validated) and zeroed device buffers. Needs a CUDA
  // device (register_backend() is called).
  explicit GpuModel(model::ModelConfig cfg);
  ~GpuModel();
  GpuModel(const GpuModel&) = delete;
  GpuModel& operator=(const GpuModel&) = delete;

  const model::ModelConfig& config() const { return cfg_; }
  const std::vector<model::ParamInfo>& param_table() const { return table_; }
  int64_t num_params() const { return params_.numel(); }
  cudaStream_t stream() const { return stream_; }

  Tensor& params() { return params_; }   // F32 [P], device: the masters
  Tensor& grads() { return grads_; }     // F32 [P], device
  // Host F32 [P] <-> device masters. load_params also refreshes the bf16 copy; store_params
  // waits for the stream.
  void load_params(const Tensor& host);
  void store_params(Tensor& host) const;
  // Refreshes the bf16 copy after the masters changed on the stream (an optimizer step).
  void params_changed();
  void zero_grads();

  // Called on the host during backward, right after the work of a backward stage has been
  // enqueued on stream(): once the stream has run up to this point (an event recorded now),
  // the gradient of every table entry from `first_final` on is final for this micro-batch, and
  // nothing later in the backward reads or writes it. first_final takes the values of
  // model::backward_stage_starts in order, ending with 0.
  using GradientsFinal = std::function<void(size_t first_final)>;
  // Enqueues the forward and backward of one micro-batch: tokens, targets are host arrays of
  // B·T ids (targets < 0 ignored; ids are checked against the vocabulary on the host). Adds
  // the batch's mean loss to the device loss sum. 1 ≤ T ≤ context. on_final (optional): see
  // GradientsFinal.
  void forward_backward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T,
                        float grad_scale, const GradientsFinal& on_final = nullptr);
  // The sum of the losses added since the last call; waits for the stream.
  double take_loss_sum();
  Tensor& loss_sum() { return loss_sum_; }  // F32 [1], device: the step's loss sum so far
  // Mean cross-entropy of one batch without gradients; waits for the stream.
  double forward_loss(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T);
  // logits [B, T, V] copied to the host as F32 (tests and tools); waits for the stream.
  Tensor forward_logits(const int32_t* tokens, int64_t B, int64_t T);

  // Decoding (see the file comment). capacity ≤ context with learned positions.
  std::unique_ptr<GpuDecodeState> new_decode_state(int64_t B, int64_t capacity);
  // A fresh state consumes the prompt [B, T] (host ids) with the parallel forward; a state that
  // already holds tokens continues one token at a time. Leaves the last position's logits in
  // state.logits() and the consumed count in state.position().
  void prefill(GpuDecodeState& state, const int32_t* tokens, int64_t B, int64_t T);
  // One token per sequence from state.tokens() (device int32 [B]); logits to state.logits();
  // advances the device position. No allocation, no host synchronization, capturable, except
  // that the first call at a new algebraic row type may grow the projection scratch: call it
  // once per row type before capturing (the generator does).
  void decode_step(GpuDecodeState& state);
  // The algebraic row type decode_step uses at a position (0 for the dense law), and the
  // number of types: one captured graph per type.
  int decode_row_type(int64_t position) const;
  int decode_row_types() const { return ffn_q_; }

  // Per-op GPU times of what runs while enabled (op_timer.h; bench model --profile).
  OpTimer& timer() { return timer_; }

  // Implementation types, defined in model.cpp.
  struct Layer;
  struct Acts;

 private:
  enum class Mode { Loss, Train, Logits, Prefill };
  void upload_tokens(const int32_t* tokens, const int32_t* targets, int64_t n, Acts& acts);
  void ensure_acts(int64_t B, int64_t T, bool training);
  void forward(Acts& acts, Mode mode, GpuDecodeState* state);
  // keep_projections = false (decoding): f_gate and f_up are scratch and may be left unwritten.
  void ffn_forward(const Layer& L, const std::vector<int>& types, const Tensor& h, Tensor& f_gate, Tensor& f_up,
                   Tensor& f_act, Tensor& out, bool keep_projections = true);
  void project_head(const Tensor& h, void* logits, int64_t ldc) const;
  void head_and_loss(Acts& acts, bool with_grad, float grad_scale);
  void backward(Acts& acts, const GradientsFinal& on_final);

  model::ModelConfig cfg_;
  std::vector<model::ParamInfo> table_;
  std::vector<size_t> stage_starts_;  // model::backward_stage_starts
  cudaStream_t stream_ = nullptr;
  Tensor params_, grads_, params_half_;
  int64_t half_gap_ = 0;  // zero elements after tok_emb in params_half_ (the padded head rows, rounded up to kParamAlign)
  std::vector<std::unique_ptr<Layer>> layers_;
  DeviceParam tok_emb_, pos_emb_, head_, norm_f_w_, norm_f_b_;
  std::unique_ptr<AlgProj> ffn_up_proj_, ffn_down_proj_;
  algebra::Schedule ffn_schedule_;
  int ffn_q_ = 1;
  std::unique_ptr<Acts> train_acts_, infer_acts_;
  Tensor loss_sum_;  // F32 [1]
  // Pinned host staging for token uploads, two slots used in turn; a slot is reused only
  // after the copy that read it has run (its event).
  struct Staging;
  std::unique_ptr<Staging> staging_;
  OpTimer timer_;
};

// Decode caches and the step's rows for B sequences in lockstep (made by
// GpuModel::new_decode_state). All buffers live on the device.
class GpuDecodeState {
 public:
  ~GpuDecodeState();
  int64_t batch() const { return B_; }
  int64_t capacity() const { return cap_; }
  int64_t position() const { return pos_; }  // tokens consumed (host mirror of the device counter)
  Tensor& logits() { return logits_; }        // BF16 [B, V]: the last consumed position's logits
  int32_t* tokens() const { return static_cast<int32_t*>(tokens_.raw()); }     // [B], device
  int32_t* device_position() const { return static_cast<int32_t*>(pos_dev_.raw()); }  // [1]
  // A replayed graph of decode_step advanced the device position: keep the host mirror equal.
  void count_replayed_step() { ++pos_; }

 private:
  friend class GpuModel;
  GpuDecodeState() = default;
  const GpuModel* owner_ = nullptr;
  int64_t B_ = 0, cap_ = 0, pos_ = 0;
  Tensor pos_dev_, tokens_;                   // int32 in F32-sized storage
  std::vector<Tensor> cache_a_, cache_b_;     // A: K, V; F: p2, Ĩ — [B, capacity, heads, Dh]
  std::vector<Tensor> state_;                 // L: C, F32 [B, H, Dh, Dh]
  Tensor x_, h_, a_, b_, c_, mixed_, y_, mean_, rstd_, gate_, r_down_;
  Tensor f_gate_, f_up_, f_act_, logits_;
  std::vector<int> row_types_;
  int32_t* pinned_ = nullptr;                 // host staging of the prompt / position
};

}  // namespace quiver::cuda

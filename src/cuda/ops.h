// The element-wise and row-wise CUDA ops of the language model: the GPU counterparts of
// src/ops/{embedding,norm,rope,activation,cross_entropy}.h and train/optimizer.h.
//
// Precision policy (shared/DESIGN.md): activations and their gradients are bf16; arithmetic
// is fp32; parameters come as fp32 master copies or their bf16 copies (made with convert);
// parameter gradients and optimizer state are fp32. Every tensor argument is a contiguous
// CUDA tensor (call register_backend() first). Each entry point checks shapes and dtypes on
// the host (throwing quiver::Error), enqueues its kernels on `stream` and returns without
// synchronizing the host. Which outputs are assigned and which accumulate follows the CPU ops.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include <cuda_runtime.h>

#include "ops/rope.h"
#include "quiver/tensor.h"
#include "train/optimizer.h"

namespace quiver::cuda {

// dst = src converted: F32 -> BF16 (round to nearest even, as quiver::float_to_bf16; NaN
// stays NaN) or BF16 -> F32 (exact). Same shape.
void convert(const Tensor& src, Tensor& dst, cudaStream_t stream = nullptr);

// Embedding. tokens: n int32 ids in device memory; table F32 [V, D]; out BF16 with n rows of
// width D (any leading shape). The ids are not range-checked on the device (that would need
// a host sync): the caller validates them on the host before uploading.
void embedding_forward(const int32_t* tokens, int64_t n, const Tensor& table, Tensor& out,
                       cudaStream_t stream = nullptr);
// dtable[tokens[i], :] += dout[i, :]; dout BF16, dtable F32 [V, D]. fp32 atomicAdd: the
// order of the additions into a repeated token's row, and so its last bits, may vary from
// run to run.
void embedding_backward_accumulate(const int32_t* tokens, int64_t n, const Tensor& dout,
                                   Tensor& dtable, cudaStream_t stream = nullptr);

// LayerNorm / RMSNorm over the last dimension, as ops/norm.h. x, y, dy, dx BF16 [N, D];
// weight, bias F32 or BF16 [D] (one dtype); mean, rstd F32 with N elements (written by the
// forward pass); dweight, dbias F32 [D], accumulated (+=). dx is assigned, or with
// accumulate_dx the norm's gradient is added to it (one rounding: bf16(dx + d norm)). The backward's
// parameter sums borrow the device's GEMM workspace (context.h), so norms and GEMMs running
// concurrently on different streams must be ordered.
void layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                       Tensor& y, Tensor& mean, Tensor& rstd, cudaStream_t stream = nullptr);
void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                        const Tensor& mean, const Tensor& rstd, Tensor& dx,
                        Tensor& dweight_accumulate, Tensor& dbias_accumulate,
                        cudaStream_t stream = nullptr, bool accumulate_dx = false);
void rmsnorm_forward(const Tensor& x, const Tensor& weight, double eps, Tensor& y, Tensor& rstd,
                     cudaStream_t stream = nullptr);
void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                      Tensor& dx, Tensor& dweight_accumulate, cudaStream_t stream = nullptr,
                      bool accumulate_dx = false);

// RoPE, rotate_half convention of ops/rope.h, on BF16 [T, H, Dh] or [B, T, H, Dh]; row t at
// position pos0 + t. Angles are formed and reduced modulo π/2 in fp64, their cos/sin taken in
// fp32 (within about 2 fp32 ulps of the fp64 values), once per (row, pair) and shared by the
// heads. The output may alias the input.
void rope_forward(const Tensor& x, Tensor& y, int64_t pos0, double base = ops::kRopeBase,
                  cudaStream_t stream = nullptr);
void rope_backward(const Tensor& dy, Tensor& dx, int64_t pos0, double base = ops::kRopeBase,
                   cudaStream_t stream = nullptr);
// RoPE of decode rows: x, y BF16 [B, H, Dh], every row at position *pos (device int32, read on
// the device so that a captured decode graph serves every position). y may alias x.
void rope_forward_at(const Tensor& x, Tensor& y, const int32_t* pos, double base = ops::kRopeBase,
                     cudaStream_t stream = nullptr);

// Activations as ops/activation.h; all BF16, one shape; outputs assigned.
void swiglu_forward(const Tensor& gate, const Tensor& up, Tensor& out,
                    cudaStream_t stream = nullptr);
void swiglu_backward(const Tensor& dout, const Tensor& gate, const Tensor& up, Tensor& dgate,
                     Tensor& dup, cudaStream_t stream = nullptr);
void gelu_forward(const Tensor& x, Tensor& y, cudaStream_t stream = nullptr);
void gelu_backward(const Tensor& dy, const Tensor& x, Tensor& dx, cudaStream_t stream = nullptr);

// Fused softmax cross-entropy, as ops/cross_entropy.h. logits BF16 [N, V] (any leading
// shape); targets: N int32 in device memory, < 0 = ignored; the caller validates ids < V on
// the host (a row with a target ≥ V gets a NaN loss and NaN dlogits instead of a throw).
// Writes row_loss (F32, N elements; 0 for ignored rows), loss (F32, one element: the mean
// over counted rows, 0 when none; reduced on the device in a fixed order) and, when dlogits
// is not null, dlogits (BF16 like logits) = scale · (softmax − onehot) / count (zero rows
// for ignored ones). N < 2^24. logits may also be a 2-d [N, V] window of a wider buffer (row
// stride > V, unit column stride: rows padded so that GEMMs writing them stay aligned); dlogits
// must then have the same shape and strides.
void cross_entropy(const Tensor& logits, const int32_t* targets, float scale, Tensor& row_loss,
                   Tensor& loss, Tensor* dlogits, cudaStream_t stream = nullptr);

// The segment table of the flat parameter buffer on the device (as train::AdamW sorts and
// validates it), plus the scratch of the gradient-norm reduction. Construction uploads with
// a synchronous copy (once per run). Calls sharing one table must not run concurrently on
// different streams (they share the scratch).
class DeviceParamSegments {
 public:
  DeviceParamSegments(std::vector<train::ParamSegment> segments, int64_t num_params);

  const std::vector<train::ParamSegment>& segments() const { return segments_; }
  int64_t num_params() const { return num_params_; }
  int64_t extent() const { return extent_; }  // end of the last segment
  const void* device_table() const { return table_.raw(); }
  double* scratch() const { return static_cast<double*>(scratch_.raw()); }
  // Where grad_square_sum leaves Σ g² and clip_to_norm reads it: one double in the scratch.
  double* square_sum() const;

 private:
  std::vector<train::ParamSegment> segments_;
  int64_t num_params_;
  int64_t extent_ = 0;
  Tensor table_;    // the SegmentDesc array, bytes held in an F64 device tensor
  Tensor scratch_;  // F64: partial sums, Σ g², scale
};

// Global-norm clipping in two halves, so that the ranks of a data-parallel run can add their
// shards' sums in between (an all-reduce of segments.square_sum()); one process calls them in
// turn. grads F32 [P].
//   grad_square_sum: Σ g² over the trainable segments (fp64 partial sums added in a fixed order:
//     deterministic, as train::grad_norm) into segments.square_sum().
//   clip_to_norm: norm = √(segments.square_sum()) written to norm (F32, one element); then, as
//     train::clip_grad_norm, the trainable gradients are scaled by max_norm / norm when
//     max_norm > 0 and norm > max_norm.
void grad_square_sum(const Tensor& grads, const DeviceParamSegments& segments, cudaStream_t stream = nullptr);
void clip_to_norm(Tensor& grads, const DeviceParamSegments& segments, double max_norm, Tensor& norm,
                  cudaStream_t stream = nullptr);

// One AdamW update (train::AdamW::step) at step t ≥ 1 (the count after this update) and
// learning rate lr: params, grads, m, v F32 [P]; m and v updated in place.
void adamw_step(Tensor& params, const Tensor& grads, Tensor& m, Tensor& v,
                const DeviceParamSegments& segments, const train::AdamWOptions& options,
                double lr, int64_t step, cudaStream_t stream = nullptr);

}  // namespace quiver::cuda

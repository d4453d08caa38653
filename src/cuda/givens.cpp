// Entry points of the GPU Givens head mixing (givens.h): host-side shape and dtype checks with
// named errors, then the launchers of relation_launch.h.
#include "cuda/tensor_args.h"
#include "cuda/givens.h"

#include <cstdint>
#include <initializer_list>

#include "cuda/check.h"
#include "cuda/context.h"
#include "cuda/relation_launch.h"
#include "ops/givens.h"

namespace quiver::cuda {
namespace {

constexpr const char* kForward = "cuda::givens_forward";
constexpr const char* kBackward = "cuda::givens_backward";
constexpr const char* kRotateWeight = "cuda::givens_rotate_weight";
constexpr const char* kWeightBackward = "cuda::givens_weight_backward";

void check_like(const Tensor& t, const Tensor& like, const char* op, const char* name,
                const char* like_name, DType dtype = DType::BF16) {
  check_cuda(t, dtype, op, name);
  QV_CHECK(t.shape() == like.shape(), "{}: {}: expected shape {} (as {}), got {}", op, name,
           shape_str(like.shape()), like_name, shape_str(t.shape()));
}

struct Geometry {
  int64_t rows, heads, head_dim;
};

// I is [..., H, Dh] of `dtype`; H is 1 or even (ops::givens_mixes); theta F32 [H/2].
Geometry check_states(const Tensor& I, const Tensor& theta, int64_t layer, const char* op,
                      DType dtype = DType::BF16, const char* name = "I") {
  check_cuda(I, dtype, op, name);
  QV_CHECK(I.ndim() >= 2, "{}: {} must be [..., H, Dh], got {}", op, name, shape_str(I.shape()));
  QV_CHECK(layer >= 0, "{}: layer index must be non-negative, got {}", op, layer);
  const Geometry g{0, I.dim(-2), I.dim(-1)};
  ops::givens_mixes(g.heads);
  check_cuda(theta, DType::F32, op, "theta");
  QV_CHECK(theta.ndim() == 1 && theta.dim(0) == g.heads / 2,
           "{}: theta: expected shape [{}], got {}", op, g.heads / 2, shape_str(theta.shape()));
  const int64_t row_size = g.heads * g.head_dim;
  return {row_size == 0 ? 0 : I.numel() / row_size, g.heads, g.head_dim};
}

// The kernels move two channels at a time: an even head width and tensors aligned to two
// elements (4 bytes for bf16, 8 for fp32).
void check_pairs_of_channels(const Geometry& g, const char* op, std::initializer_list<const Tensor*> ts) {
  QV_CHECK(g.head_dim % 2 == 0, "{}: the head width must be even, got {}", op, g.head_dim);
  for (const Tensor* t : ts) {
    const size_t align = 2 * dtype_size(t->dtype());
    QV_CHECK(reinterpret_cast<uintptr_t>(t->raw()) % align == 0, "{}: tensors must be {}-byte aligned", op, align);
  }
}

// The dθ partial sums use the device's GEMM workspace (context.h: stream-ordered scratch).
double* dtheta_partials(const Geometry& g, const char* op) {
  const Context& ctx = context();
  QV_CHECK(detail::kGivensDthetaBlocks * (g.heads / 2) * sizeof(double) <= ctx.workspace_bytes(),
           "{}: {} heads exceed the scratch of the dθ sums", op, g.heads);
  return static_cast<double*>(ctx.workspace());
}

void check_dtheta(const Tensor& dtheta_accumulate, const Tensor& theta, const char* op) {
  check_cuda(dtheta_accumulate, DType::F32, op, "dtheta_accumulate");
  QV_CHECK(dtheta_accumulate.shape() == theta.shape(), "{}: dtheta_accumulate: expected shape {} (as theta), got {}",
           op, shape_str(theta.shape()), shape_str(dtheta_accumulate.shape()));
}

// H = 1: the identity, a device copy unless the output is the input.
void copy_unless_same(const Tensor& src, Tensor& dst, cudaStream_t stream) {
  if (dst.raw() != src.raw() && src.nbytes() > 0)
    QV_CUDA_CHECK(
        cudaMemcpyAsync(dst.raw(), src.raw(), src.nbytes(), cudaMemcpyDeviceToDevice, stream));
}


}  // namespace

void givens_forward(const Tensor& I, const Tensor& theta, int64_t layer, Tensor& out,
                    cudaStream_t stream) {
  const Geometry g = check_states(I, theta, layer, kForward);
  check_like(out, I, kForward, "out", "I");
  if (g.heads == 1) return copy_unless_same(I, out, stream);
  check_pairs_of_channels(g, kForward, {&I, &out});
  detail::launch_givens_forward(bf16_in(I), static_cast<const float*>(theta.raw()), g.rows, g.heads,
                                g.head_dim, layer, bf16_out(out), stream);
}

void givens_backward(const Tensor& dOut, const Tensor& I, const Tensor& theta, int64_t layer,
                     Tensor& dI, Tensor& dtheta_accumulate, cudaStream_t stream) {
  const Geometry g = check_states(I, theta, layer, kBackward);
  check_like(dOut, I, kBackward, "dOut", "I");
  check_like(dI, I, kBackward, "dI", "I");
  check_dtheta(dtheta_accumulate, theta, kBackward);
  if (g.heads == 1) return copy_unless_same(dOut, dI, stream);
  check_pairs_of_channels(g, kBackward, {&dOut, &I, &dI});
  detail::launch_givens_backward(bf16_in(dOut), bf16_in(I), static_cast<const float*>(theta.raw()),
                                 g.rows, g.heads, g.head_dim, layer, bf16_out(dI),
                                 static_cast<float*>(dtheta_accumulate.raw()), dtheta_partials(g, kBackward),
                                 stream);
}

void givens_rotate_weight(const Tensor& w, const Tensor& theta, int64_t layer, Tensor& out, cudaStream_t stream) {
  const Geometry g = check_states(w, theta, layer, kRotateWeight, DType::F32, "w");
  check_like(out, w, kRotateWeight, "out", "w");
  QV_CHECK(g.heads > 1, "{}: one head has nothing to mix", kRotateWeight);
  check_pairs_of_channels(g, kRotateWeight, {&w, &out});
  detail::launch_givens_rotate_weight(static_cast<const float*>(w.raw()), static_cast<const float*>(theta.raw()),
                                      g.rows, g.heads, g.head_dim, layer, bf16_out(out), stream);
}

void givens_weight_backward(Tensor& dw, const Tensor& base, const Tensor& w, const Tensor& theta, int64_t layer,
                            Tensor& dtheta_accumulate, cudaStream_t stream) {
  const Geometry g = check_states(w, theta, layer, kWeightBackward, DType::F32, "w");
  check_like(dw, w, kWeightBackward, "dw", "w", DType::F32);
  check_like(base, w, kWeightBackward, "base", "w", DType::F32);
  QV_CHECK(base.raw() != dw.raw(), "{}: base must not be dw", kWeightBackward);
  check_dtheta(dtheta_accumulate, theta, kWeightBackward);
  QV_CHECK(g.heads > 1, "{}: one head has nothing to mix", kWeightBackward);
  check_pairs_of_channels(g, kWeightBackward, {&dw, &base, &w});
  detail::launch_givens_weight_backward(static_cast<float*>(dw.raw()), static_cast<const float*>(base.raw()),
                                        static_cast<const float*>(w.raw()), static_cast<const float*>(theta.raw()),
                                        g.rows, g.heads, g.head_dim, layer,
                                        static_cast<float*>(dtheta_accumulate.raw()),
                                        dtheta_partials(g, kWeightBackward), stream);
}

}  // namespace quiver::cuda

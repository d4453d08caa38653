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

void check_like(const Tensor& t, const Tensor& like, const char* op, const char* name,
                const char* like_name) {
  check_cuda(t, DType::BF16, op, name);
  QV_CHECK(t.shape() == like.shape(), "{}: {}: expected shape {} (as {}), got {}", op, name,
           shape_str(like.shape()), like_name, shape_str(t.shape()));
}

struct Geometry {
  int64_t rows, heads, head_dim;
};

// I is BF16 [..., H, Dh]; H is 1 or even (ops::givens_mixes); theta F32 [H/2].
Geometry check_states(const Tensor& I, const Tensor& theta, int64_t layer, const char* op) {
  check_cuda(I, DType::BF16, op, "I");
  QV_CHECK(I.ndim() >= 2, "{}: I must be [..., H, Dh], got {}", op, shape_str(I.shape()));
  QV_CHECK(layer >= 0, "{}: layer index must be non-negative, got {}", op, layer);
  const Geometry g{0, I.dim(-2), I.dim(-1)};
  ops::givens_mixes(g.heads);
  check_cuda(theta, DType::F32, op, "theta");
  QV_CHECK(theta.ndim() == 1 && theta.dim(0) == g.heads / 2,
           "{}: theta: expected shape [{}], got {}", op, g.heads / 2, shape_str(theta.shape()));
  const int64_t row_size = g.heads * g.head_dim;
  return {row_size == 0 ? 0 : I.numel() / row_size, g.heads, g.head_dim};
}

// The kernels move two channels at a time: an even head width and 4-byte aligned tensors.
void check_pairs_of_channels(const Geometry& g, const char* op, std::initializer_list<const Tensor*> ts) {
  QV_CHECK(g.head_dim % 2 == 0, "{}: the head width must be even, got {}", op, g.head_dim);
  for (const Tensor* t : ts)
    QV_CHECK(reinterpret_cast<uintptr_t>(t->raw()) % 4 == 0, "{}: tensors must be 4-byte aligned", op);
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
  check_cuda(dtheta_accumulate, DType::F32, kBackward, "dtheta_accumulate");
  QV_CHECK(dtheta_accumulate.shape() == theta.shape(),
           "{}: dtheta_accumulate: expected shape {} (as theta), got {}", kBackward,
           shape_str(theta.shape()), shape_str(dtheta_accumulate.shape()));
  if (g.heads == 1) return copy_unless_same(dOut, dI, stream);
  check_pairs_of_channels(g, kBackward, {&dOut, &I, &dI});
  // The dθ partial sums use the device's GEMM workspace (context.h: stream-ordered scratch).
  const Context& ctx = context();
  QV_CHECK(detail::kGivensDthetaBlocks * (g.heads / 2) * sizeof(double) <= ctx.workspace_bytes(),
           "{}: {} heads exceed the scratch of the dθ sums", kBackward, g.heads);
  detail::launch_givens_backward(bf16_in(dOut), bf16_in(I), static_cast<const float*>(theta.raw()),
                                 g.rows, g.heads, g.head_dim, layer, bf16_out(dI),
                                 static_cast<float*>(dtheta_accumulate.raw()),
                                 static_cast<double*>(ctx.workspace()), stream);
}

}  // namespace quiver::cuda

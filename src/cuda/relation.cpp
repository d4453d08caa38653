// Entry points of the GPU FlashRelation (relation.h): host-side shape and dtype checks with
// named errors, then the launcher instantiated for the head width rounded up to a multiple of
// 16 (relation_launch.h).
#include "cuda/tensor_args.h"
#include "cuda/relation.h"

#include <cmath>
#include <cstdint>
#include <limits>

#include "cuda/attention_launch.h"
#include "cuda/check.h"
#include "cuda/context.h"
#include "cuda/relation_launch.h"
#include "ops/head_shape.h"

namespace quiver::cuda {
namespace {

static_assert(detail::kRelationPadStep == 16, "dispatch_padded_width instantiates multiples of 16");

constexpr const char* kForward = "cuda::flash_relation_forward";
constexpr const char* kBackward = "cuda::flash_relation_backward";
constexpr const char* kDecode = "cuda::relation_decode_step";

detail::RelationRule rule_of(const RelationKernelOptions& o, int64_t Dh, const char* op) {
  QV_CHECK(o.tau_s > 0 && std::isfinite(o.tau_s), "{}: tau_s must be positive and finite, got {}",
           op, o.tau_s);
  return {static_cast<float>(1.0 / std::sqrt(static_cast<double>(Dh))), 1.0f / o.tau_s,
          o.exchange_only};
}

void check_head_width(int64_t Dh, const char* op) {
  QV_CHECK(Dh <= detail::kRelationMaxHeadDim, "{}: head width {} exceeds the supported {}", op, Dh,
           detail::kRelationMaxHeadDim);
}

struct Problem {
  detail::RelationDims dims;
  Shape stats_shape;
};

Problem check_inputs(const Tensor& p1, const Tensor& p2, const Tensor& v, const float* lambda,
                     const char* op) {
  check_cuda(p1, op, "p1");
  const ops::HeadShape hs = ops::head_shape(p1.shape(), "p1");
  check_head_width(hs.Dh, op);
  const int64_t grid_limit = 65535;  // gridDim.y (heads) and gridDim.z (batch)
  QV_CHECK(hs.H <= grid_limit && hs.B <= grid_limit, "{}: {} heads and batch {} exceed {}", op,
           hs.H, hs.B, grid_limit);
  QV_CHECK(hs.T <= std::numeric_limits<int32_t>::max(), "{}: T = {} is too long", op, hs.T);
  check_cuda(p1, DType::BF16, p1.shape(), op, "p1");
  check_cuda(p2, DType::BF16, p1.shape(), op, "p2");
  check_cuda(v, DType::BF16, p1.shape(), op, "v");
  QV_CHECK(lambda != nullptr, "{}: lambda is null", op);
  Problem pr{{hs.B, hs.T, hs.H, hs.Dh}, {}};
  pr.stats_shape = p1.ndim() == 4 ? Shape{hs.B, hs.H, hs.T, 3} : Shape{hs.H, hs.T, 3};
  return pr;
}


}  // namespace

void flash_relation_forward(const Tensor& p1, const Tensor& p2, const Tensor& v,
                            const float* lambda, Tensor& y, Tensor& stats,
                            const RelationKernelOptions& options, cudaStream_t stream) {
  const Problem pr = check_inputs(p1, p2, v, lambda, kForward);
  check_cuda(y, DType::BF16, p1.shape(), kForward, "y");
  check_cuda(stats, DType::F32, pr.stats_shape, kForward, "stats");
  const detail::RelationForwardArgs args{pr.dims,     rule_of(options, pr.dims.Dh, kForward),
                                         bf16_in(p1), bf16_in(p2),
                                         bf16_in(v),  lambda,
                                         bf16_out(y), static_cast<float*>(stats.raw())};
  dispatch_padded_width(pr.dims.Dh, args, stream,
                      []<int P>(const detail::RelationForwardArgs& a, cudaStream_t s) {
                        detail::launch_relation_forward<P>(a, s);
                      }, "cuda::flash_relation");
}

int64_t flash_relation_backward_workspace_bytes(int64_t B, int64_t T, int64_t H) {
  QV_CHECK(B >= 0 && T >= 0 && H >= 0,
           "cuda::flash_relation_backward_workspace_bytes: sizes must be non-negative, got B = {}, "
           "T = {}, H = {}",
           B, T, H);
  return detail::relation_backward_workspace_bytes(B, T, H);
}

void flash_relation_backward(const Tensor& p1, const Tensor& p2, const Tensor& v,
                             const float* lambda, const Tensor& y, const Tensor& stats,
                             const Tensor& dy, Tensor& dp1, Tensor& dp2, Tensor& dv,
                             float* dlambda_accumulate, const RelationKernelOptions& options,
                             Tensor& workspace, cudaStream_t stream) {
  const Problem pr = check_inputs(p1, p2, v, lambda, kBackward);
  check_cuda(y, DType::BF16, p1.shape(), kBackward, "y");
  check_cuda(stats, DType::F32, pr.stats_shape, kBackward, "stats");
  check_cuda(dy, DType::BF16, p1.shape(), kBackward, "dy");
  check_cuda(dp1, DType::BF16, p1.shape(), kBackward, "dp1");
  check_cuda(dp2, DType::BF16, p1.shape(), kBackward, "dp2");
  check_cuda(dv, DType::BF16, p1.shape(), kBackward, "dv");
  check_cuda(workspace, kBackward, "workspace");
  const detail::RelationDims& d = pr.dims;
  const int64_t need = detail::relation_backward_workspace_bytes(d.B, d.T, d.H);
  QV_CHECK(static_cast<int64_t>(workspace.nbytes()) >= need,
           "{}: workspace: needs {} bytes (flash_relation_backward_workspace_bytes), got {}",
           kBackward, need, workspace.nbytes());
  QV_CHECK(reinterpret_cast<uintptr_t>(workspace.raw()) % alignof(double) == 0,
           "{}: workspace must be 8-byte aligned", kBackward);
  const detail::RelationBackwardArgs args{d,
                                          rule_of(options, d.Dh, kBackward),
                                          bf16_in(p1),
                                          bf16_in(p2),
                                          bf16_in(v),
                                          lambda,
                                          bf16_in(y),
                                          static_cast<const float*>(stats.raw()),
                                          bf16_in(dy),
                                          bf16_out(dp1),
                                          bf16_out(dp2),
                                          bf16_out(dv),
                                          dlambda_accumulate,
                                          workspace.raw(),
                                          flash_dq_atomics() && detail::flash_dq_one_pass(d.Dh)
                                              ? static_cast<float*>(context().flash_scratch(
                                                    sizeof(float) * detail::flash_dq_sum_floats(
                                                                        {d.B, d.T, d.H, d.H, d.Dh})))
                                              : nullptr};
  dispatch_padded_width(d.Dh, args, stream,
                      []<int P>(const detail::RelationBackwardArgs& a, cudaStream_t s) {
                        detail::launch_relation_backward<P>(a, s);
                      }, "cuda::flash_relation");
}

void relation_decode_step(const Tensor& p1_row, const Tensor& p2_row, const Tensor& v_row,
                          const float* lambda, Tensor& cache_p2, Tensor& cache_v,
                          const int32_t* d_pos, Tensor& y_row, const RelationKernelOptions& options,
                          cudaStream_t stream) {
  check_cuda(cache_p2, kDecode, "cache_p2");
  QV_CHECK(cache_p2.ndim() == 4 && cache_p2.numel() > 0,
           "{}: cache_p2 must be [B, capacity, H, Dh] with positive sizes, got {}", kDecode,
           shape_str(cache_p2.shape()));
  const int64_t B = cache_p2.dim(0), capacity = cache_p2.dim(1), H = cache_p2.dim(2),
                Dh = cache_p2.dim(3);
  check_head_width(Dh, kDecode);
  QV_CHECK(H <= 65535 && B <= 65535, "{}: {} heads and batch {} exceed 65535", kDecode, H, B);
  check_cuda(cache_p2, DType::BF16, cache_p2.shape(), kDecode, "cache_p2");
  check_cuda(cache_v, DType::BF16, cache_p2.shape(), kDecode, "cache_v");
  const Shape row_shape{B, H, Dh};
  check_cuda(p1_row, DType::BF16, row_shape, kDecode, "p1_row");
  check_cuda(p2_row, DType::BF16, row_shape, kDecode, "p2_row");
  check_cuda(v_row, DType::BF16, row_shape, kDecode, "v_row");
  check_cuda(y_row, DType::BF16, row_shape, kDecode, "y_row");
  QV_CHECK(lambda != nullptr, "{}: lambda is null", kDecode);
  QV_CHECK(d_pos != nullptr, "{}: d_pos is null", kDecode);
  const detail::RelationDecodeArgs args{B,
                                        H,
                                        Dh,
                                        capacity,
                                        rule_of(options, Dh, kDecode),
                                        bf16_in(p1_row),
                                        bf16_in(p2_row),
                                        bf16_in(v_row),
                                        lambda,
                                        bf16_out(cache_p2),
                                        bf16_out(cache_v),
                                        d_pos,
                                        bf16_out(y_row)};
  detail::launch_relation_decode(args, stream);
}

}  // namespace quiver::cuda

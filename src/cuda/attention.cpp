// Entry points of the GPU flash attention (attention.h): host-side shape and dtype checks with
// named errors, then the launcher instantiated for the head width rounded up to a multiple of
// 16 (attention_launch.h).
#include "cuda/tensor_args.h"
#include "cuda/attention.h"

#include <cstdint>
#include <limits>

#include "cuda/attention_launch.h"
#include "cuda/check.h"
#include "cuda/context.h"
#include "ops/head_shape.h"

namespace quiver::cuda {
namespace {

static_assert(detail::kAttentionPadStep == 16, "dispatch_padded_width instantiates multiples of 16");

constexpr const char* kForward = "cuda::attention_forward";
constexpr const char* kBackward = "cuda::attention_backward";
constexpr const char* kDecode = "cuda::attention_decode_step";

void check_input(const Tensor& t, DType dtype, const Shape& shape, const char* op,
                 const char* name) {
  QV_CHECK(t.defined(), "{}: {} is undefined", op, name);
  QV_CHECK(t.device() == Device::CUDA && t.is_contiguous(),
           "{}: {} must be a contiguous CUDA tensor (shape {}, device {})", op, name,
           shape_str(t.shape()), quiver::device_name(t.device()));
  QV_CHECK(t.dtype() == dtype, "{}: {}: expected dtype {}, got {}", op, name, dtype_name(dtype),
           dtype_name(t.dtype()));
  QV_CHECK(t.shape() == shape, "{}: {}: expected shape {}, got {}", op, name, shape_str(shape),
           shape_str(t.shape()));
}

// An undefined output is allocated; a given one must have the stated shape and dtype.
void prepare_output(Tensor& t, DType dtype, const Shape& shape, const char* op,
                    const char* name) {
  if (!t.defined()) {
    t = Tensor::empty(shape, dtype, Device::CUDA);
    return;
  }
  check_input(t, dtype, shape, op, name);
}

struct Problem {
  detail::AttentionDims dims;
  Shape q_shape, kv_shape, lse_shape;
};

Problem check_qkv(const Tensor& q, const Tensor& k, const Tensor& v, const char* op) {
  QV_CHECK(q.defined() && k.defined() && v.defined(), "{}: q, k and v must be defined", op);
  const ops::HeadShape hq = ops::head_shape(q.shape(), "q");
  const ops::HeadShape hk = ops::head_shape(k.shape(), "k");
  QV_CHECK(k.ndim() == q.ndim() && hk.B == hq.B && hk.T == hq.T && hk.Dh == hq.Dh &&
               hq.H % hk.H == 0,
           "{}: k: expected the batch, time and head width of q {} with a divisor of its {} "
           "heads, got {}",
           op, shape_str(q.shape()), hq.H, shape_str(k.shape()));
  QV_CHECK(hq.Dh <= detail::kAttentionMaxHeadDim, "{}: head width {} exceeds the supported {}",
           op, hq.Dh, detail::kAttentionMaxHeadDim);
  const int64_t grid_limit = 65535;  // gridDim.y (heads) and gridDim.z (batch)
  QV_CHECK(hq.H <= grid_limit && hq.B <= grid_limit, "{}: {} heads and batch {} exceed {}", op,
           hq.H, hq.B, grid_limit);
  QV_CHECK(hq.T <= std::numeric_limits<int32_t>::max(), "{}: T = {} is too long", op, hq.T);
  Problem pr{{hq.B, hq.T, hq.H, hk.H, hq.Dh}, q.shape(), k.shape(), {}};
  pr.lse_shape = q.ndim() == 4 ? Shape{hq.B, hq.H, hq.T} : Shape{hq.H, hq.T};
  check_input(q, DType::BF16, pr.q_shape, op, "q");
  check_input(k, DType::BF16, pr.kv_shape, op, "k");
  check_input(v, DType::BF16, pr.kv_shape, op, "v");
  return pr;
}


}  // namespace

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& y, Tensor& lse,
                       cudaStream_t stream) {
  const Problem pr = check_qkv(q, k, v, kForward);
  prepare_output(y, DType::BF16, pr.q_shape, kForward, "y");
  prepare_output(lse, DType::F32, pr.lse_shape, kForward, "lse");
  const detail::AttentionForwardArgs args{pr.dims,      bf16_in(q), bf16_in(k), bf16_in(v),
                                          bf16_out(y), static_cast<float*>(lse.raw())};
  dispatch_padded_width(pr.dims.Dh, args, stream,
                      []<int P>(const detail::AttentionForwardArgs& a, cudaStream_t s) {
                        detail::launch_attention_forward<P>(a, s);
                      }, "cuda::attention");
}

void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& y,
                        const Tensor& lse, const Tensor& dy, Tensor& dq, Tensor& dk, Tensor& dv,
                        cudaStream_t stream) {
  const Problem pr = check_qkv(q, k, v, kBackward);
  check_input(y, DType::BF16, pr.q_shape, kBackward, "y");
  check_input(lse, DType::F32, pr.lse_shape, kBackward, "lse");
  check_input(dy, DType::BF16, pr.q_shape, kBackward, "dy");
  prepare_output(dq, DType::BF16, pr.q_shape, kBackward, "dq");
  prepare_output(dk, DType::BF16, pr.kv_shape, kBackward, "dk");
  prepare_output(dv, DType::BF16, pr.kv_shape, kBackward, "dv");
  detail::AttentionBackwardArgs args{pr.dims,
                                     bf16_in(q),
                                     bf16_in(k),
                                     bf16_in(v),
                                     bf16_in(y),
                                     static_cast<const float*>(lse.raw()),
                                     bf16_in(dy),
                                     bf16_out(dq),
                                     bf16_out(dk),
                                     bf16_out(dv),
                                     nullptr};
  // D per query row, then (one-pass dQ) the fp32 dQ sums, in the device's flash scratch.
  const detail::AttentionDims& dd = pr.dims;
  const int64_t rows = dd.B * dd.Hq * dd.T, delta_floats = (rows + 3) / 4 * 4;  // 16-byte aligned sums
  const int64_t sums =
      flash_dq_atomics() && detail::flash_dq_one_pass(dd.Dh) ? detail::flash_dq_sum_floats(dd) : 0;
  args.delta = static_cast<float*>(context().flash_scratch(sizeof(float) * (delta_floats + sums)));
  args.dq_accum = sums > 0 ? args.delta + delta_floats : nullptr;
  dispatch_padded_width(pr.dims.Dh, args, stream,
                      []<int P>(const detail::AttentionBackwardArgs& a, cudaStream_t s) {
                        detail::launch_attention_backward<P>(a, s);
                      }, "cuda::attention");
}

void attention_decode_step(const Tensor& q_row, const Tensor& k_row, const Tensor& v_row,
                           Tensor& cache_k, Tensor& cache_v, const int32_t* d_pos, Tensor& y_row,
                           cudaStream_t stream) {
  QV_CHECK(q_row.defined() && k_row.defined() && v_row.defined() && cache_k.defined() &&
               cache_v.defined(),
           "{}: q_row, k_row, v_row, cache_k and cache_v must be defined", kDecode);
  QV_CHECK(q_row.ndim() == 3, "{}: q_row: expected [B, Hq, Dh], got {}", kDecode,
           shape_str(q_row.shape()));
  const int64_t B = q_row.dim(0), Hq = q_row.dim(1), Dh = q_row.dim(2);
  QV_CHECK(k_row.ndim() == 3 && k_row.dim(0) == B && k_row.dim(2) == Dh && k_row.dim(1) > 0 &&
               Hq % k_row.dim(1) == 0,
           "{}: k_row: expected [{}, a divisor of {}, {}], got {}", kDecode, B, Hq, Dh,
           shape_str(k_row.shape()));
  const int64_t Hkv = k_row.dim(1);
  QV_CHECK(B > 0 && Hq > 0 && Dh > 0, "{}: q_row: every size must be positive, got {}", kDecode,
           shape_str(q_row.shape()));
  QV_CHECK(Dh <= detail::kAttentionMaxHeadDim, "{}: head width {} exceeds the supported {}",
           kDecode, Dh, detail::kAttentionMaxHeadDim);
  QV_CHECK(B <= 65535, "{}: batch {} exceeds 65535", kDecode, B);
  QV_CHECK(cache_k.ndim() == 4 && cache_k.dim(0) == B && cache_k.dim(2) == Hkv &&
               cache_k.dim(3) == Dh && cache_k.dim(1) > 0,
           "{}: cache_k: expected [{}, capacity, {}, {}], got {}", kDecode, B, Hkv, Dh,
           shape_str(cache_k.shape()));
  QV_CHECK(d_pos != nullptr, "{}: d_pos is null", kDecode);
  const Shape kv_shape = k_row.shape(), cache_shape = cache_k.shape();
  check_input(q_row, DType::BF16, q_row.shape(), kDecode, "q_row");
  check_input(k_row, DType::BF16, kv_shape, kDecode, "k_row");
  check_input(v_row, DType::BF16, kv_shape, kDecode, "v_row");
  check_input(cache_k, DType::BF16, cache_shape, kDecode, "cache_k");
  check_input(cache_v, DType::BF16, cache_shape, kDecode, "cache_v");
  prepare_output(y_row, DType::BF16, q_row.shape(), kDecode, "y_row");
  const detail::AttentionDecodeArgs args{B,
                                         Hq,
                                         Hkv,
                                         Dh,
                                         cache_shape[1],
                                         bf16_in(q_row),
                                         bf16_in(k_row),
                                         bf16_in(v_row),
                                         bf16_out(cache_k),
                                         bf16_out(cache_v),
                                         d_pos,
                                         bf16_out(y_row)};
  detail::launch_attention_decode(args, stream);
}

}  // namespace quiver::cuda

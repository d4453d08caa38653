// Entry points of the GPU Linear Relation (linear_relation.h): host-side shape and dtype checks
// with named errors, the workspace carving, then the launchers (linear_relation_launch.h)
// instantiated for the head width rounded up to a multiple of 16, and cuda::gemm for the
// retention gate's products.
#include "cuda/tensor_args.h"
#include "cuda/linear_relation.h"

#include <cmath>
#include <cstdint>
#include <limits>

#include "cuda/check.h"
#include "cuda/context.h"
#include "cuda/gemm.h"
#include "cuda/linear_relation_launch.h"
#include "ops/head_shape.h"

namespace quiver::cuda {
namespace {

static_assert(detail::kLinearRelationPadStep == 16, "dispatch_padded_width instantiates multiples of 16");

constexpr const char* kForward = "cuda::linear_relation_forward";
constexpr const char* kBackward = "cuda::linear_relation_backward";
constexpr const char* kDecode = "cuda::linear_relation_decode_step";
constexpr const char* kGateForward = "cuda::retention_gate_forward";
constexpr const char* kGateBackward = "cuda::retention_gate_backward";
constexpr int64_t kGridLimit = 65535;  // gridDim.y and gridDim.z

void check_tau(float tau_s, const char* op) {
  QV_CHECK(std::isfinite(tau_s) && tau_s > 0, "{}: tau_s must be finite and positive, got {}", op,
           tau_s);
}

float gate_scale(float tau_s, int64_t Dh) {
  return static_cast<float>(1.0 / (static_cast<double>(tau_s) * std::sqrt(static_cast<double>(Dh))));
}

int64_t chunks_of(int64_t T) {
  return (T + detail::kLinearRelationChunk - 1) / detail::kLinearRelationChunk;
}

void check_head_width(int64_t Dh, const char* op) {
  QV_CHECK(Dh <= detail::kLinearRelationMaxHeadDim, "{}: head width {} exceeds the supported {}",
           op, Dh, detail::kLinearRelationMaxHeadDim);
}

// p1, p2, v BF16 and g F32 of one [B, T, H, Dh] (or [T, H, Dh]) shape, checked; returns the
// kernel arguments they give (dims, gate scale, the inputs).
detail::LinearRelationArgs sequence_args(const Tensor& p1, const Tensor& p2, const Tensor& v,
                                         const Tensor& g, float tau_s, const char* op) {
  check_cuda(p1, op, "p1");
  const ops::HeadShape hs = ops::head_shape(p1.shape(), "p1");
  check_head_width(hs.Dh, op);
  QV_CHECK(hs.H <= kGridLimit && hs.B <= kGridLimit && hs.B * hs.H <= kGridLimit,
           "{}: batch {} and {} heads exceed the grid limit {} (B·H included)", op, hs.B, hs.H,
           kGridLimit);
  QV_CHECK(chunks_of(hs.T) <= std::numeric_limits<int32_t>::max(), "{}: T = {} is too long", op,
           hs.T);
  check_cuda(p1, DType::BF16, p1.shape(), op, "p1");
  check_cuda(p2, DType::BF16, p1.shape(), op, "p2");
  check_cuda(v, DType::BF16, p1.shape(), op, "v");
  check_cuda(g, DType::F32, p1.shape(), op, "g");
  check_tau(tau_s, op);
  detail::LinearRelationArgs args{};
  args.dims = {hs.B, hs.T, hs.H, hs.Dh, chunks_of(hs.T)};
  args.gate_scale = gate_scale(tau_s, hs.Dh);
  args.p1 = bf16_in(p1);
  args.p2 = bf16_in(p2);
  args.v = bf16_in(v);
  args.g = static_cast<const float*>(g.raw());
  return args;
}

detail::LinearRelationWorkspace carve_workspace(Tensor& workspace,
                                                const detail::LinearRelationDims& d,
                                                const char* op) {
  check_cuda(workspace, op, "workspace");
  const int64_t need = linear_relation_workspace_bytes(d.B, d.T, d.H, d.Dh);
  QV_CHECK(static_cast<int64_t>(workspace.nbytes()) >= need,
           "{}: workspace: {} bytes, need {} (linear_relation_workspace_bytes)", op,
           workspace.nbytes(), need);
  QV_CHECK(reinterpret_cast<uintptr_t>(workspace.raw()) % alignof(float) == 0,
           "{}: workspace must be aligned to {} bytes", op, alignof(float));
  const int64_t state_floats = d.heads() * d.chunks * d.Dh * d.Dh;
  float* base = static_cast<float*>(workspace.raw());
  return {base, base + state_floats, base + 2 * state_floats};
}


struct GateDims {
  int64_t N, D, Dh, H;
};

GateDims check_gate(const Tensor& x, const Tensor& w_down, const Tensor& w_up,
                    const Tensor& a_log, const Tensor& dt_bias, const char* op) {
  check_cuda(x, op, "x");
  check_cuda(w_down, op, "w_down");
  check_cuda(a_log, op, "a_log");
  QV_CHECK(x.ndim() == 2, "{}: x: expected shape [N, D], got {}", op, shape_str(x.shape()));
  QV_CHECK(w_down.ndim() == 2, "{}: w_down: expected shape [D, Dh], got {}", op,
           shape_str(w_down.shape()));
  QV_CHECK(a_log.ndim() == 1, "{}: a_log: expected shape [H], got {}", op,
           shape_str(a_log.shape()));
  const GateDims gd{x.dim(0), x.dim(1), w_down.dim(1), a_log.dim(0)};
  QV_CHECK(gd.D >= 1 && gd.Dh >= 1 && gd.H >= 1,
           "{}: x {}, w_down {}, a_log {}: D, Dh and H must be at least 1", op,
           shape_str(x.shape()), shape_str(w_down.shape()), shape_str(a_log.shape()));
  QV_CHECK(gd.H <= std::numeric_limits<int32_t>::max(), "{}: {} heads are too many", op, gd.H);
  check_cuda(x, DType::BF16, {gd.N, gd.D}, op, "x");
  check_cuda(w_down, DType::BF16, {gd.D, gd.Dh}, op, "w_down");
  check_cuda(w_up, DType::BF16, {gd.Dh, gd.H * gd.Dh}, op, "w_up");
  check_cuda(a_log, DType::F32, {gd.H}, op, "a_log");
  check_cuda(dt_bias, DType::F32, {gd.H * gd.Dh}, op, "dt_bias");
  return gd;
}

}  // namespace

int64_t linear_relation_workspace_bytes(int64_t B, int64_t T, int64_t H, int64_t Dh) {
  QV_CHECK(B >= 0 && T >= 0 && H >= 0 && Dh >= 0,
           "linear_relation_workspace_bytes: negative size B={} T={} H={} Dh={}", B, T, H, Dh);
  const int64_t per_chunk = 2 * Dh * Dh + Dh;  // state, dL/dC, decays
  return static_cast<int64_t>(sizeof(float)) * B * H * chunks_of(T) * per_chunk;
}

void linear_relation_forward(const Tensor& p1, const Tensor& p2, const Tensor& v, const Tensor& g,
                             Tensor& y, float tau_s, Tensor& workspace, Tensor* final_state,
                             cudaStream_t stream) {
  detail::LinearRelationArgs args = sequence_args(p1, p2, v, g, tau_s, kForward);
  const detail::LinearRelationDims& d = args.dims;
  check_cuda(y, DType::BF16, p1.shape(), kForward, "y");
  if (final_state)
    check_cuda(*final_state, DType::F32, {d.B, d.H, d.Dh, d.Dh}, kForward, "final_state");
  args.y = bf16_out(y);
  args.final_state = final_state ? static_cast<float*>(final_state->raw()) : nullptr;
  args.ws = carve_workspace(workspace, d, kForward);
  dispatch_padded_width(d.Dh, args, stream,
                      []<int P>(const detail::LinearRelationArgs& a, cudaStream_t s) {
                        detail::launch_linear_relation_forward<P>(a, s);
                      }, "cuda::linear_relation");
}

void linear_relation_backward(const Tensor& p1, const Tensor& p2, const Tensor& v, const Tensor& g,
                              const Tensor& dy, Tensor& dp1, Tensor& dp2, Tensor& dv, Tensor& dg,
                              float tau_s, Tensor& workspace, cudaStream_t stream) {
  detail::LinearRelationArgs args = sequence_args(p1, p2, v, g, tau_s, kBackward);
  const detail::LinearRelationDims& d = args.dims;
  check_cuda(dy, DType::BF16, p1.shape(), kBackward, "dy");
  check_cuda(dp1, DType::BF16, p1.shape(), kBackward, "dp1");
  check_cuda(dp2, DType::BF16, p1.shape(), kBackward, "dp2");
  check_cuda(dv, DType::BF16, p1.shape(), kBackward, "dv");
  check_cuda(dg, DType::F32, p1.shape(), kBackward, "dg");
  args.dy = bf16_in(dy);
  args.dp1 = bf16_out(dp1);
  args.dp2 = bf16_out(dp2);
  args.dv = bf16_out(dv);
  args.dg = static_cast<float*>(dg.raw());
  args.ws = carve_workspace(workspace, d, kBackward);
  dispatch_padded_width(d.Dh, args, stream,
                      []<int P>(const detail::LinearRelationArgs& a, cudaStream_t s) {
                        detail::launch_linear_relation_backward<P>(a, s);
                      }, "cuda::linear_relation");
}

void linear_relation_decode_step(const Tensor& p1_row, const Tensor& p2_row, const Tensor& v_row,
                                 const Tensor& g_row, Tensor& state, Tensor& y_row, float tau_s,
                                 cudaStream_t stream) {
  check_cuda(p1_row, kDecode, "p1_row");
  QV_CHECK(p1_row.ndim() == 3 && p1_row.numel() > 0,
           "{}: p1_row: expected shape [B, H, Dh] with positive sizes, got {}", kDecode,
           shape_str(p1_row.shape()));
  const int64_t B = p1_row.dim(0), H = p1_row.dim(1), Dh = p1_row.dim(2);
  check_head_width(Dh, kDecode);
  QV_CHECK(B * H <= std::numeric_limits<int32_t>::max(), "{}: {} heads in all are too many",
           kDecode, B * H);
  check_cuda(p1_row, DType::BF16, p1_row.shape(), kDecode, "p1_row");
  check_cuda(p2_row, DType::BF16, p1_row.shape(), kDecode, "p2_row");
  check_cuda(v_row, DType::BF16, p1_row.shape(), kDecode, "v_row");
  check_cuda(g_row, DType::F32, p1_row.shape(), kDecode, "g_row");
  check_cuda(y_row, DType::BF16, p1_row.shape(), kDecode, "y_row");
  check_cuda(state, DType::F32, {B, H, Dh, Dh}, kDecode, "state");
  check_tau(tau_s, kDecode);
  detail::launch_linear_relation_decode_step(
      bf16_in(p1_row), bf16_in(p2_row), bf16_in(v_row), static_cast<const float*>(g_row.raw()),
      static_cast<float*>(state.raw()), bf16_out(y_row), B * H, Dh, gate_scale(tau_s, Dh),
      stream);
}

void retention_gate_forward(const Tensor& x, const Tensor& w_down, const Tensor& w_up,
                            const Tensor& a_log, const Tensor& dt_bias, Tensor& r_down, Tensor& g,
                            cudaStream_t stream) {
  const GateDims gd = check_gate(x, w_down, w_up, a_log, dt_bias, kGateForward);
  const int64_t HD = gd.H * gd.Dh;
  check_cuda(r_down, DType::BF16, {gd.N, gd.Dh}, kGateForward, "r_down");
  check_cuda(g, DType::F32, {gd.N, HD}, kGateForward, "g");
  if (gd.N == 0) return;
  gemm(false, false, gd.N, gd.Dh, gd.D, 1.0f, x.raw(), DType::BF16, gd.D, w_down.raw(),
       DType::BF16, gd.Dh, 0.0f, r_down.raw(), DType::BF16, gd.Dh, stream);
  gemm(false, false, gd.N, HD, gd.Dh, 1.0f, r_down.raw(), DType::BF16, gd.Dh, w_up.raw(),
       DType::BF16, HD, 0.0f, g.raw(), DType::F32, HD, stream);
  detail::launch_retention_gate_activation(static_cast<float*>(g.raw()),
                                           static_cast<const float*>(a_log.raw()),
                                           static_cast<const float*>(dt_bias.raw()), gd.N, gd.H,
                                           gd.Dh, stream);
}

void retention_gate_backward(const Tensor& x, const Tensor& w_down, const Tensor& w_up,
                             const Tensor& a_log, const Tensor& dt_bias, const Tensor& r_down,
                             const Tensor& dg, Tensor& dx_accumulate, Tensor& dw_down_accumulate,
                             Tensor& dw_up_accumulate, Tensor& da_log_accumulate,
                             Tensor& ddt_bias_accumulate, Tensor& scratch_dr,
                             Tensor& scratch_dr_down, cudaStream_t stream) {
  const char* op = kGateBackward;
  const GateDims gd = check_gate(x, w_down, w_up, a_log, dt_bias, op);
  const int64_t HD = gd.H * gd.Dh;
  check_cuda(r_down, DType::BF16, {gd.N, gd.Dh}, op, "r_down");
  check_cuda(dg, DType::F32, {gd.N, HD}, op, "dg");
  check_cuda(dx_accumulate, DType::BF16, {gd.N, gd.D}, op, "dx_accumulate");
  check_cuda(dw_down_accumulate, DType::F32, {gd.D, gd.Dh}, op, "dw_down_accumulate");
  check_cuda(dw_up_accumulate, DType::F32, {gd.Dh, HD}, op, "dw_up_accumulate");
  check_cuda(da_log_accumulate, DType::F32, {gd.H}, op, "da_log_accumulate");
  check_cuda(ddt_bias_accumulate, DType::F32, {HD}, op, "ddt_bias_accumulate");
  check_cuda(scratch_dr, DType::BF16, {gd.N, HD}, op, "scratch_dr");
  check_cuda(scratch_dr_down, DType::BF16, {gd.N, gd.Dh}, op, "scratch_dr_down");
  // The parameter sums' partials use the device's GEMM workspace (context.h), stream-ordered
  // like the GEMMs around them.
  const Context& ctx = context();
  QV_CHECK(static_cast<size_t>(HD * 4 + gd.H * 8 + 8) <= ctx.workspace_bytes(),
           "{}: {} heads of {} channels exceed the scratch of the parameter sums", op, gd.H, gd.Dh);
  if (gd.N == 0) return;
  // r = r_down W_up, then dz in place.
  gemm(false, false, gd.N, HD, gd.Dh, 1.0f, r_down.raw(), DType::BF16, gd.Dh, w_up.raw(),
       DType::BF16, HD, 0.0f, scratch_dr.raw(), DType::BF16, HD, stream);
  detail::launch_retention_gate_backward_elementwise(
      bf16_out(scratch_dr), static_cast<const float*>(dg.raw()),
      static_cast<const float*>(a_log.raw()), static_cast<const float*>(dt_bias.raw()),
      static_cast<float*>(da_log_accumulate.raw()), static_cast<float*>(ddt_bias_accumulate.raw()),
      gd.N, gd.H, gd.Dh, ctx.workspace(), ctx.workspace_bytes(), stream);
  // dW_up += r_downᵀ dz;  d(r_down) = dz W_upᵀ.
  gemm(true, false, gd.Dh, HD, gd.N, 1.0f, r_down.raw(), DType::BF16, gd.Dh, scratch_dr.raw(),
       DType::BF16, HD, 1.0f, dw_up_accumulate.raw(), DType::F32, HD, stream);
  gemm(false, true, gd.N, gd.Dh, HD, 1.0f, scratch_dr.raw(), DType::BF16, HD, w_up.raw(),
       DType::BF16, HD, 0.0f, scratch_dr_down.raw(), DType::BF16, gd.Dh, stream);
  // dW_down += xᵀ d(r_down);  dx += d(r_down) W_downᵀ.
  gemm(true, false, gd.D, gd.Dh, gd.N, 1.0f, x.raw(), DType::BF16, gd.D, scratch_dr_down.raw(),
       DType::BF16, gd.Dh, 1.0f, dw_down_accumulate.raw(), DType::F32, gd.Dh, stream);
  gemm(false, true, gd.N, gd.D, gd.Dh, 1.0f, scratch_dr_down.raw(), DType::BF16, gd.Dh,
       w_down.raw(), DType::BF16, gd.Dh, 1.0f, dx_accumulate.raw(), DType::BF16, gd.D, stream);
}

}  // namespace quiver::cuda

// Entry points of the element-wise and row-wise CUDA ops (ops.h): host-side shape and dtype
// checks with named errors, then the launchers of elementwise_launch.h.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <utility>

#include "cuda/tensor_args.h"
#include "cuda/check.h"
#include "cuda/context.h"
#include "cuda/elementwise_launch.h"
#include "cuda/ops.h"

namespace quiver::cuda {
namespace {

void check_like(const Tensor& t, const Tensor& like, DType dtype, const char* op, const char* name,
                const char* like_name) {
  check_cuda(t, dtype, op, name);
  QV_CHECK(t.shape() == like.shape(), "{}: {}: expected shape {} (as {}), got {}", op, name,
           shape_str(like.shape()), like_name, shape_str(t.shape()));
}

void check_vector(const Tensor& t, int64_t size, DType dtype, const char* op, const char* name) {
  check_cuda(t, dtype, op, name);
  QV_CHECK(t.ndim() == 1 && t.dim(0) == size, "{}: {}: expected shape [{}], got {}", op, name,
           size, shape_str(t.shape()));
}

void check_count(const Tensor& t, int64_t count, DType dtype, const char* op, const char* name) {
  check_cuda(t, dtype, op, name);
  QV_CHECK(t.numel() == count, "{}: {}: expected {} elements, got shape {}", op, name, count,
           shape_str(t.shape()));
}


// x is BF16 [..., D]: rows = product of the leading dims (one block each: < 2^31).
// The norm backward's split sums use the device's GEMM workspace (context.h): both run in
// stream order, so they never overlap on one stream.
float* norm_scratch() { return static_cast<float*>(context().workspace()); }
int64_t norm_scratch_floats() { return static_cast<int64_t>(context().workspace_bytes() / sizeof(float)); }

struct Rows {
  int64_t count;
  int64_t width;
};

Rows bf16_rows(const Tensor& x, const char* op, const char* name) {
  check_cuda(x, DType::BF16, op, name);
  QV_CHECK(x.ndim() >= 1 && x.dim(-1) > 0, "{}: {} must be [N, D] with D > 0, got {}", op, name,
           shape_str(x.shape()));
  const Rows rows{x.numel() / x.dim(-1), x.dim(-1)};
  QV_CHECK(rows.count <= std::numeric_limits<int32_t>::max(), "{}: {} has too many rows ({})", op,
           name, rows.count);
  return rows;
}

// Norm parameters: F32 or BF16 [D], all of one dtype. Returns whether they are BF16.
bool check_norm_params(std::initializer_list<std::pair<const Tensor*, const char*>> params,
                       int64_t width, const char* op) {
  const Tensor& first = *params.begin()->first;
  QV_CHECK(first.defined() && (first.dtype() == DType::F32 || first.dtype() == DType::BF16),
           "{}: {} must be F32 or BF16", op, params.begin()->second);
  for (const auto& [t, name] : params) check_vector(*t, width, first.dtype(), op, name);
  return first.dtype() == DType::BF16;
}

void check_eps(double eps, const char* op) {
  QV_CHECK(eps >= 0 && std::isfinite(eps), "{}: eps must be finite and non-negative, got {}", op,
           eps);
}

void check_elementwise(const char* op,
                       std::initializer_list<std::pair<const Tensor*, const char*>> tensors) {
  const Tensor& first = *tensors.begin()->first;
  for (const auto& [t, name] : tensors) {
    check_cuda(*t, DType::BF16, op, name);
    QV_CHECK(t->shape() == first.shape(), "{}: {}: expected shape {} (as {}), got {}", op, name,
             shape_str(first.shape()), tensors.begin()->second, shape_str(t->shape()));
  }
}

// The embedding's table [V, D] and rows tensor (n rows of width D, any leading shape).
void check_embedding(const char* op, const int32_t* tokens, int64_t n, const Tensor& table,
                     const char* table_name, const Tensor& rows, const char* rows_name) {
  QV_CHECK(n >= 0, "{}: token count must be non-negative, got {}", op, n);
  QV_CHECK(n == 0 || tokens != nullptr, "{}: tokens is null but n = {}", op, n);
  check_cuda(table, DType::F32, op, table_name);
  check_cuda(rows, DType::BF16, op, rows_name);
  QV_CHECK(table.ndim() == 2, "{}: {} must be [V, D], got {}", op, table_name,
           shape_str(table.shape()));
  const int64_t width = table.dim(1);
  QV_CHECK(rows.ndim() >= 1 && rows.dim(-1) == width && rows.numel() == n * width,
           "{}: {} must hold {} rows of width {}, got {}", op, rows_name, n, width,
           shape_str(rows.shape()));
}

void rope_dispatch(const Tensor& in, Tensor& out, int64_t pos0, const int32_t* pos_offset,
                   double base, bool inverse, const char* op, const char* in_name,
                   const char* out_name, cudaStream_t stream) {
  check_cuda(in, DType::BF16, op, in_name);
  QV_CHECK(in.ndim() == 3 || in.ndim() == 4, "{}: {} must be [T, H, Dh] or [B, T, H, Dh], got {}",
           op, in_name, shape_str(in.shape()));
  const int64_t head_dim = in.dim(-1);
  QV_CHECK(head_dim > 0 && head_dim % 2 == 0 && head_dim <= 2 * detail::kRopeMaxHalf,
           "{}: head width must be even, positive and at most {}, got {}", op, 2 * detail::kRopeMaxHalf,
           head_dim);
  QV_CHECK(in.dim(-2) * head_dim < (int64_t{1} << 31), "{}: {} rows are too wide ({} heads)", op, in_name,
           in.dim(-2));
  QV_CHECK(pos0 >= 0, "{}: pos0 must be non-negative, got {}", op, pos0);
  QV_CHECK(std::isfinite(base) && base > 0, "{}: base must be positive and finite, got {}", op,
           base);
  check_like(out, in, DType::BF16, op, out_name, in_name);
  const int64_t batch = in.ndim() == 4 ? in.dim(0) : 1;
  QV_CHECK(batch * in.dim(-3) < (int64_t{1} << 33), "{}: {} has too many rows ({})", op, in_name,
           batch * in.dim(-3));  // one block per 8 rows, < 2^30 blocks
  detail::launch_rope(bf16_in(in), bf16_out(out), batch, in.dim(-3), in.dim(-2), head_dim, pos0,
                      pos_offset, base, inverse, stream);
}

}  // namespace

void convert(const Tensor& src, Tensor& dst, cudaStream_t stream) {
  const char* op = "cuda::convert";
  check_cuda(src, op, "src");
  check_cuda(dst, op, "dst");
  QV_CHECK(src.shape() == dst.shape(), "{}: dst: expected shape {} (as src), got {}", op,
           shape_str(src.shape()), shape_str(dst.shape()));
  if (src.dtype() == DType::F32 && dst.dtype() == DType::BF16)
    detail::launch_f32_to_bf16(f32_in(src), bf16_out(dst), src.numel(), stream);
  else if (src.dtype() == DType::BF16 && dst.dtype() == DType::F32)
    detail::launch_bf16_to_f32(bf16_in(src), f32_out(dst), src.numel(), stream);
  else
    fail("{}: converts F32 -> BF16 or BF16 -> F32, got {} -> {}", op, dtype_name(src.dtype()),
         dtype_name(dst.dtype()));
}

void embedding_forward(const int32_t* tokens, int64_t n, const Tensor& table, Tensor& out,
                       cudaStream_t stream) {
  check_embedding("cuda::embedding_forward", tokens, n, table, "table", out, "out");
  detail::launch_embedding_forward(tokens, n, f32_in(table), table.dim(1), bf16_out(out), stream);
}

void embedding_backward_accumulate(const int32_t* tokens, int64_t n, const Tensor& dout,
                                   Tensor& dtable, cudaStream_t stream) {
  check_embedding("cuda::embedding_backward", tokens, n, dtable, "dtable", dout, "dout");
  detail::launch_embedding_backward(tokens, n, bf16_in(dout), dtable.dim(1), f32_out(dtable),
                                    stream);
}

void layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                       Tensor& y, Tensor& mean, Tensor& rstd, cudaStream_t stream) {
  const char* op = "cuda::layernorm_forward";
  const Rows rows = bf16_rows(x, op, "x");
  check_eps(eps, op);
  const bool bf16 = check_norm_params({{&weight, "weight"}, {&bias, "bias"}}, rows.width, op);
  check_like(y, x, DType::BF16, op, "y", "x");
  check_count(mean, rows.count, DType::F32, op, "mean");
  check_count(rstd, rows.count, DType::F32, op, "rstd");
  detail::launch_norm_forward(bf16_in(x), weight.raw(), bias.raw(), bf16, static_cast<float>(eps),
                              rows.count, rows.width, bf16_out(y), f32_out(mean), f32_out(rstd),
                              stream);
}

void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                        const Tensor& mean, const Tensor& rstd, Tensor& dx,
                        Tensor& dweight_accumulate, Tensor& dbias_accumulate,
                        cudaStream_t stream, bool accumulate_dx) {
  const char* op = "cuda::layernorm_backward";
  const Rows rows = bf16_rows(x, op, "x");
  check_like(dy, x, DType::BF16, op, "dy", "x");
  const bool bf16 = check_norm_params({{&weight, "weight"}}, rows.width, op);
  check_count(mean, rows.count, DType::F32, op, "mean");
  check_count(rstd, rows.count, DType::F32, op, "rstd");
  check_like(dx, x, DType::BF16, op, "dx", "x");
  check_vector(dweight_accumulate, rows.width, DType::F32, op, "dweight");
  check_vector(dbias_accumulate, rows.width, DType::F32, op, "dbias");
  detail::launch_norm_backward(bf16_in(dy), bf16_in(x), weight.raw(), bf16, f32_in(mean),
                               f32_in(rstd), rows.count, rows.width, bf16_out(dx), accumulate_dx,
                               f32_out(dweight_accumulate), f32_out(dbias_accumulate),
                               norm_scratch(), norm_scratch_floats(), stream);
}

void rmsnorm_forward(const Tensor& x, const Tensor& weight, double eps, Tensor& y, Tensor& rstd,
                     cudaStream_t stream) {
  const char* op = "cuda::rmsnorm_forward";
  const Rows rows = bf16_rows(x, op, "x");
  check_eps(eps, op);
  const bool bf16 = check_norm_params({{&weight, "weight"}}, rows.width, op);
  check_like(y, x, DType::BF16, op, "y", "x");
  check_count(rstd, rows.count, DType::F32, op, "rstd");
  detail::launch_norm_forward(bf16_in(x), weight.raw(), nullptr, bf16, static_cast<float>(eps),
                              rows.count, rows.width, bf16_out(y), nullptr, f32_out(rstd), stream);
}

void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                      Tensor& dx, Tensor& dweight_accumulate, cudaStream_t stream,
                      bool accumulate_dx) {
  const char* op = "cuda::rmsnorm_backward";
  const Rows rows = bf16_rows(x, op, "x");
  check_like(dy, x, DType::BF16, op, "dy", "x");
  const bool bf16 = check_norm_params({{&weight, "weight"}}, rows.width, op);
  check_count(rstd, rows.count, DType::F32, op, "rstd");
  check_like(dx, x, DType::BF16, op, "dx", "x");
  check_vector(dweight_accumulate, rows.width, DType::F32, op, "dweight");
  detail::launch_norm_backward(bf16_in(dy), bf16_in(x), weight.raw(), bf16, nullptr, f32_in(rstd),
                               rows.count, rows.width, bf16_out(dx), accumulate_dx, f32_out(dweight_accumulate),
                               nullptr, norm_scratch(), norm_scratch_floats(), stream);
}

void rope_forward(const Tensor& x, Tensor& y, int64_t pos0, double base, cudaStream_t stream) {
  rope_dispatch(x, y, pos0, nullptr, base, false, "cuda::rope_forward", "x", "y", stream);
}

void rope_backward(const Tensor& dy, Tensor& dx, int64_t pos0, double base, cudaStream_t stream) {
  rope_dispatch(dy, dx, pos0, nullptr, base, true, "cuda::rope_backward", "dy", "dx", stream);
}

void rope_forward_at(const Tensor& x, Tensor& y, const int32_t* pos, double base,
                     cudaStream_t stream) {
  const char* op = "cuda::rope_forward_at";
  QV_CHECK(pos != nullptr, "{}: pos must point to the device position", op);
  QV_CHECK(x.ndim() == 3, "{}: x must be decode rows [B, H, Dh], got {}", op, shape_str(x.shape()));
  // [B, H, Dh] rows are [B, 1, H, Dh]: one position per sequence.
  Tensor x4 = x.reshape({x.dim(0), 1, x.dim(1), x.dim(2)});
  Tensor y4 = y.reshape({y.dim(0), 1, y.dim(1), y.dim(2)});
  rope_dispatch(x4, y4, 0, pos, base, false, op, "x", "y", stream);
}

void swiglu_forward(const Tensor& gate, const Tensor& up, Tensor& out, cudaStream_t stream) {
  check_elementwise("cuda::swiglu_forward", {{&gate, "gate"}, {&up, "up"}, {&out, "out"}});
  detail::launch_swiglu_forward(bf16_in(gate), bf16_in(up), bf16_out(out), gate.numel(), stream);
}

void swiglu_backward(const Tensor& dout, const Tensor& gate, const Tensor& up, Tensor& dgate,
                     Tensor& dup, cudaStream_t stream) {
  check_elementwise("cuda::swiglu_backward", {{&gate, "gate"},
                                              {&dout, "dout"},
                                              {&up, "up"},
                                              {&dgate, "dgate"},
                                              {&dup, "dup"}});
  detail::launch_swiglu_backward(bf16_in(dout), bf16_in(gate), bf16_in(up), bf16_out(dgate),
                                 bf16_out(dup), gate.numel(), stream);
}

void gelu_forward(const Tensor& x, Tensor& y, cudaStream_t stream) {
  check_elementwise("cuda::gelu_forward", {{&x, "x"}, {&y, "y"}});
  detail::launch_gelu_forward(bf16_in(x), bf16_out(y), x.numel(), stream);
}

void gelu_backward(const Tensor& dy, const Tensor& x, Tensor& dx, cudaStream_t stream) {
  check_elementwise("cuda::gelu_backward", {{&x, "x"}, {&dy, "dy"}, {&dx, "dx"}});
  detail::launch_gelu_backward(bf16_in(dy), bf16_in(x), bf16_out(dx), x.numel(), stream);
}

void cross_entropy(const Tensor& logits, const int32_t* targets, float scale, Tensor& row_loss,
                   Tensor& loss, Tensor* dlogits, cudaStream_t stream) {
  const char* op = "cuda::cross_entropy";
  // A [N, V] window of a wider buffer (rows padded for aligned GEMMs) is accepted as is.
  const bool padded_rows = logits.ndim() == 2 && logits.strides()[1] == 1 && logits.strides()[0] > logits.dim(1);
  if (padded_rows) {
    QV_CHECK(logits.device() == Device::CUDA && logits.dtype() == DType::BF16,
             "{}: logits must be a BF16 CUDA tensor", op);
    if (dlogits)
      QV_CHECK(dlogits->shape() == logits.shape() && dlogits->strides() == logits.strides() &&
                   dlogits->dtype() == DType::BF16 && dlogits->device() == Device::CUDA,
               "{}: dlogits must have the shape and row stride of logits", op);
  }
  const Rows rows = padded_rows ? Rows{logits.dim(0), logits.dim(1)} : bf16_rows(logits, op, "logits");
  const int64_t ld = padded_rows ? logits.strides()[0] : rows.width;
  QV_CHECK(rows.count < (int64_t{1} << 24), "{}: at most 2^24 rows, got {}", op, rows.count);
  QV_CHECK(rows.count == 0 || targets != nullptr, "{}: targets is null for {} rows", op,
           rows.count);
  QV_CHECK(std::isfinite(scale), "{}: scale must be finite, got {}", op, scale);
  check_count(row_loss, rows.count, DType::F32, op, "row_loss");
  check_count(loss, 1, DType::F32, op, "loss");
  if (dlogits && !padded_rows) check_like(*dlogits, logits, DType::BF16, op, "dlogits", "logits");
  detail::launch_cross_entropy(bf16_in(logits), targets, rows.count, rows.width, ld, scale,
                               f32_out(row_loss), dlogits ? bf16_out(*dlogits) : nullptr,
                               f32_out(loss), stream);
}

DeviceParamSegments::DeviceParamSegments(std::vector<train::ParamSegment> segments,
                                         int64_t num_params)
    : segments_(train::sorted_segments(std::move(segments), num_params, "DeviceParamSegments")),
      num_params_(num_params) {
  QV_CHECK(segments_.size() < static_cast<size_t>(std::numeric_limits<int32_t>::max()),
           "DeviceParamSegments: too many segments ({})", segments_.size());
  std::vector<detail::SegmentDesc> table;
  extent_ = 0;
  for (const train::ParamSegment& s : segments_) {
    table.push_back({s.offset, s.numel, s.decay ? 1 : 0, s.trainable ? 1 : 0});
    extent_ = s.offset + s.numel;
  }
  static_assert(sizeof(detail::SegmentDesc) % sizeof(double) == 0);
  const int64_t words = std::max<int64_t>(
      1, static_cast<int64_t>(table.size() * sizeof(detail::SegmentDesc) / sizeof(double)));
  // Through a host tensor: the backend's copy has landed when it returns (cuda/backend.cu).
  Tensor host = Tensor::zeros({words}, DType::F64);
  if (!table.empty()) std::memcpy(host.raw(), table.data(), table.size() * sizeof(table[0]));
  table_ = Tensor::empty({words}, DType::F64, Device::CUDA);
  table_.copy_from(host);
  scratch_ = Tensor::zeros({detail::kGradNormScratch}, DType::F64, Device::CUDA);
}

double* DeviceParamSegments::square_sum() const { return scratch() + detail::kGradNormSum; }

void grad_square_sum(const Tensor& grads, const DeviceParamSegments& segments, cudaStream_t stream) {
  const char* op = "cuda::grad_square_sum";
  check_vector(grads, segments.num_params(), DType::F32, op, "grads");
  detail::launch_grad_square_sum(f32_in(grads), static_cast<const detail::SegmentDesc*>(segments.device_table()),
                                 static_cast<int>(segments.segments().size()), segments.extent(),
                                 segments.scratch(), stream);
}

void clip_to_norm(Tensor& grads, const DeviceParamSegments& segments, double max_norm, Tensor& norm,
                  cudaStream_t stream) {
  const char* op = "cuda::clip_to_norm";
  check_vector(grads, segments.num_params(), DType::F32, op, "grads");
  check_count(norm, 1, DType::F32, op, "norm");
  QV_CHECK(max_norm >= 0 && std::isfinite(max_norm), "{}: max_norm must be finite and ≥ 0 (0 = off), got {}", op,
           max_norm);
  detail::launch_clip_to_norm(f32_out(grads), static_cast<const detail::SegmentDesc*>(segments.device_table()),
                              static_cast<int>(segments.segments().size()), segments.extent(), max_norm,
                              segments.scratch(), f32_out(norm), stream);
}

void adamw_step(Tensor& params, const Tensor& grads, Tensor& m, Tensor& v,
                const DeviceParamSegments& segments, const train::AdamWOptions& options,
                double lr, int64_t step, cudaStream_t stream) {
  const char* op = "cuda::adamw_step";
  const int64_t p = segments.num_params();
  check_vector(params, p, DType::F32, op, "params");
  check_vector(grads, p, DType::F32, op, "grads");
  check_vector(m, p, DType::F32, op, "m");
  check_vector(v, p, DType::F32, op, "v");
  QV_CHECK(step >= 1, "{}: step must be at least 1, got {}", op, step);
  QV_CHECK(std::isfinite(lr), "{}: lr must be finite, got {}", op, lr);
  QV_CHECK(options.beta1 >= 0 && options.beta1 < 1, "{}: beta1 must be in [0, 1), got {}", op,
           options.beta1);
  QV_CHECK(options.beta2 >= 0 && options.beta2 < 1, "{}: beta2 must be in [0, 1), got {}", op,
           options.beta2);
  QV_CHECK(options.eps > 0, "{}: eps must be positive, got {}", op, options.eps);
  QV_CHECK(options.weight_decay >= 0, "{}: weight decay must be non-negative, got {}", op,
           options.weight_decay);
  // The same double expressions as train::AdamW::step.
  detail::AdamWConstants c;
  c.beta1 = options.beta1;
  c.beta2 = options.beta2;
  c.eps = options.eps;
  c.step_size = lr / (1.0 - std::pow(options.beta1, static_cast<double>(step)));
  c.bc2_sqrt = std::sqrt(1.0 - std::pow(options.beta2, static_cast<double>(step)));
  c.decay_factor = 1.0 - lr * options.weight_decay;
  detail::launch_adamw(f32_out(params), f32_in(grads), f32_out(m), f32_out(v),
                       static_cast<const detail::SegmentDesc*>(segments.device_table()),
                       static_cast<int>(segments.segments().size()), segments.extent(), c,
                       stream);
}

}  // namespace quiver::cuda

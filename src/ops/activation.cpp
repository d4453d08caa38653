#include "ops/activation.h"

#include <cmath>
#include <initializer_list>
#include <utility>

#include "quiver/parallel.h"

namespace quiver::ops {
namespace {

constexpr int64_t kElementGrain = 16384;

// All tensors of one call: defined, contiguous CPU, the first one's dtype (F32 or F64) and
// shape. Names the offending tensor.
void check_elementwise(const char* op,
                       std::initializer_list<std::pair<const Tensor*, const char*>> tensors) {
  const Tensor& first = *tensors.begin()->first;
  const char* first_name = tensors.begin()->second;
  for (const auto& [t, name] : tensors) {
    QV_CHECK(t->defined(), "{}: {} is undefined", op, name);
    QV_CHECK(t->device() == Device::CPU && t->is_contiguous(),
             "{}: {} must be a contiguous CPU tensor (shape {})", op, name, shape_str(t->shape()));
    QV_CHECK(t->dtype() == DType::F32 || t->dtype() == DType::F64,
             "{}: {} must be F32 or F64, got {}", op, name, dtype_name(t->dtype()));
    QV_CHECK(t->dtype() == first.dtype(), "{}: {}: expected dtype {} (as {}), got {}", op, name,
             dtype_name(first.dtype()), first_name, dtype_name(t->dtype()));
    QV_CHECK(t->shape() == first.shape(), "{}: {}: expected shape {} (as {}), got {}", op, name,
             shape_str(first.shape()), first_name, shape_str(t->shape()));
  }
}

template <typename T>
T sigmoid(T g) {
  return T(1) / (T(1) + std::exp(-g));
}

template <typename T>
void swiglu_forward_impl(const T* gate, const T* up, T* out, int64_t n) {
  parallel_for(n, kElementGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) out[i] = gate[i] * sigmoid(gate[i]) * up[i];
  });
}

// d silu(g)/dg = σ(g) · (1 + g · (1 − σ(g))).
template <typename T>
void swiglu_backward_impl(const T* dout, const T* gate, const T* up, T* dgate, T* dup, int64_t n) {
  parallel_for(n, kElementGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const T g = gate[i], s = sigmoid(g), d = dout[i];
      dgate[i] = d * up[i] * s * (T(1) + g * (T(1) - s));
      dup[i] = d * g * s;
    }
  });
}

// GPT-2's tanh approximation: u = √(2/π)(x + 0.044715 x³), y = ½ x (1 + tanh u).
// Evaluated through the identity ½(1 + tanh u) = σ(2u), since exp is several times
// cheaper than tanh in libm; then ½(1 − tanh² u) = 2σ(1 − σ) and
// dy/dx = σ(2u) + 2x σ(2u)(1 − σ(2u)) √(2/π)(1 + 3 · 0.044715 x²).
constexpr double kGeluScale = 0.7978845608028654;  // √(2/π)
constexpr double kGeluCubic = 0.044715;

template <typename T>
T gelu_gate(T v) {
  const T scale = static_cast<T>(kGeluScale), cubic = static_cast<T>(kGeluCubic);
  return sigmoid(T(2) * scale * (v + cubic * v * v * v));
}

template <typename T>
void gelu_forward_impl(const T* x, T* y, int64_t n) {
  parallel_for(n, kElementGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) y[i] = x[i] * gelu_gate(x[i]);
  });
}

template <typename T>
void gelu_backward_impl(const T* dy, const T* x, T* dx, int64_t n) {
  const T scale = static_cast<T>(kGeluScale), cubic = static_cast<T>(kGeluCubic);
  parallel_for(n, kElementGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const T v = x[i];
      const T s = gelu_gate(v);
      const T spread = s * (T(1) - s);
      // Where the gate has saturated, spread = 0 and x² may have overflowed: skip the 0 · ∞.
      const T curvature =
          spread == T(0) ? T(0) : T(2) * v * spread * scale * (T(1) + T(3) * cubic * v * v);
      dx[i] = dy[i] * (s + curvature);
    }
  });
}

}  // namespace

void swiglu_forward(const Tensor& gate, const Tensor& up, Tensor& out) {
  check_elementwise("swiglu_forward", {{&gate, "gate"}, {&up, "up"}, {&out, "out"}});
  if (gate.dtype() == DType::F32)
    swiglu_forward_impl(gate.data<float>(), up.data<float>(), out.data<float>(), gate.numel());
  else
    swiglu_forward_impl(gate.data<double>(), up.data<double>(), out.data<double>(), gate.numel());
}

void swiglu_backward(const Tensor& dout, const Tensor& gate, const Tensor& up, Tensor& dgate,
                     Tensor& dup) {
  check_elementwise("swiglu_backward", {{&gate, "gate"},
                                        {&dout, "dout"},
                                        {&up, "up"},
                                        {&dgate, "dgate"},
                                        {&dup, "dup"}});
  if (gate.dtype() == DType::F32)
    swiglu_backward_impl(dout.data<float>(), gate.data<float>(), up.data<float>(),
                         dgate.data<float>(), dup.data<float>(), gate.numel());
  else
    swiglu_backward_impl(dout.data<double>(), gate.data<double>(), up.data<double>(),
                         dgate.data<double>(), dup.data<double>(), gate.numel());
}

void gelu_forward(const Tensor& x, Tensor& y) {
  check_elementwise("gelu_forward", {{&x, "x"}, {&y, "y"}});
  if (x.dtype() == DType::F32)
    gelu_forward_impl(x.data<float>(), y.data<float>(), x.numel());
  else
    gelu_forward_impl(x.data<double>(), y.data<double>(), x.numel());
}

void gelu_backward(const Tensor& dy, const Tensor& x, Tensor& dx) {
  check_elementwise("gelu_backward", {{&x, "x"}, {&dy, "dy"}, {&dx, "dx"}});
  if (x.dtype() == DType::F32)
    gelu_backward_impl(dy.data<float>(), x.data<float>(), dx.data<float>(), x.numel());
  else
    gelu_backward_impl(dy.data<double>(), x.data<double>(), dx.data<double>(), x.numel());
}

}  // namespace quiver::ops

// Helpers shared by the GPU tests: the skip check, host <-> device copies and poisoned outputs.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include <cuda_runtime.h>

#include "cuda/backend.h"
#include "cuda/check.h"
#include "cuda/context.h"
#include "quiver/rng.h"
#include "quiver/tensor.h"

namespace quiver::gpu_testing {

// False (the test then skips) when no CUDA device is present; registers the backend otherwise.
inline bool have_gpu() {
  if (cuda::device_count() == 0) return false;
  cuda::register_backend();
  return true;
}

// The flash backward's one-pass dQ (cuda::flash_dq_atomics) for the scope's lifetime.
struct OnePassDq {
  OnePassDq() { cuda::set_flash_dq_atomics(true); }
  ~OnePassDq() { cuda::set_flash_dq_atomics(false); }
  OnePassDq(const OnePassDq&) = delete;
  OnePassDq& operator=(const OnePassDq&) = delete;
};

// A device copy of a host tensor, in its dtype or converted to `dtype` first.
inline Tensor to_device(const Tensor& host) {
  Tensor dev = Tensor::empty(host.shape(), host.dtype(), Device::CUDA);
  dev.copy_from(host);
  return dev;
}
inline Tensor to_device(const Tensor& host, DType dtype) { return to_device(host.to(dtype)); }

// A host copy of a device tensor, after the device has finished all queued work.
inline Tensor to_host(const Tensor& dev) {
  QV_CUDA_CHECK(cudaDeviceSynchronize());
  Tensor host = Tensor::empty(dev.shape(), dev.dtype());
  host.copy_from(dev);
  return host;
}
inline Tensor to_host_f64(const Tensor& dev) { return to_host(dev).to(DType::F64); }

// All-ones bytes are NaN in bf16, fp32 and fp64, so elements a kernel forgot to write show.
inline void poison(Tensor& dev) {
  ASSERT_EQ(cudaMemset(dev.raw(), 0xFF, dev.nbytes()), cudaSuccess);
}
inline Tensor poisoned(const Shape& shape, DType dtype) {
  Tensor t = Tensor::empty(shape, dtype, Device::CUDA);
  QV_CUDA_CHECK(cudaMemset(t.raw(), 0xFF, t.nbytes()));
  return t;
}

// |t| elementwise for an F64 host tensor (for error bounds built from absolute values).
inline Tensor abs_of(const Tensor& f64) {
  Tensor a = f64.clone();
  double* p = a.data<double>();
  for (int64_t i = 0; i < a.numel(); ++i) p[i] = std::fabs(p[i]);
  return a;
}

// Random bf16 values (host); their F64 copy is exact, so a reference sees the kernel's inputs.
inline Tensor random_bf16(const Shape& shape, Rng& rng, double lo = -2.0, double hi = 2.0) {
  Tensor t = Tensor::empty(shape, DType::F32);
  rng.fill_uniform(t, lo, hi);
  return t.to(DType::BF16);
}

// The Euclidean norm of a host tensor, in F64.
inline double norm(const Tensor& t) {
  const Tensor d = t.to(DType::F64);
  const double* p = d.data<double>();
  double s = 0;
  for (int64_t i = 0; i < d.numel(); ++i) s += p[i] * p[i];
  return std::sqrt(s);
}

// ‖got − ref‖ / max(‖ref‖, 1), both F64 host tensors of one shape; NaN (an unwritten output)
// stays NaN.
inline double error(const Tensor& got, const Tensor& ref) {
  EXPECT_EQ(got.shape(), ref.shape());
  const double* g = got.data<double>();
  const double* r = ref.data<double>();
  double diff = 0;
  for (int64_t i = 0; i < got.numel(); ++i) diff += (g[i] - r[i]) * (g[i] - r[i]);
  return std::sqrt(diff) / std::max(norm(ref), 1.0);
}

}  // namespace quiver::gpu_testing

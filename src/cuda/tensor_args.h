// Host-side argument checks and raw pointers shared by the CUDA ops' entry points (.cpp files
// only: the messages use fmt, which nvcc cannot compile). Every check names the op and the
// tensor.
#pragma once
#include <cstdint>

#include <cuda_runtime.h>

#include "quiver/error.h"
#include "quiver/tensor.h"

namespace quiver::cuda {

// A defined, contiguous CUDA tensor (of `dtype`, of `shape`).
inline void check_cuda(const Tensor& t, const char* op, const char* name) {
  QV_CHECK(t.defined(), "{}: {} is undefined", op, name);
  QV_CHECK(t.device() == Device::CUDA && t.is_contiguous(),
           "{}: {} must be a contiguous CUDA tensor (shape {}, device {})", op, name,
           shape_str(t.shape()), quiver::device_name(t.device()));
}
inline void check_cuda(const Tensor& t, DType dtype, const char* op, const char* name) {
  check_cuda(t, op, name);
  QV_CHECK(t.dtype() == dtype, "{}: {}: expected dtype {}, got {}", op, name, dtype_name(dtype),
           dtype_name(t.dtype()));
}
inline void check_cuda(const Tensor& t, DType dtype, const Shape& shape, const char* op, const char* name) {
  check_cuda(t, dtype, op, name);
  QV_CHECK(t.shape() == shape, "{}: {}: expected shape {}, got {}", op, name, shape_str(shape),
           shape_str(t.shape()));
}

// Raw device pointers; bf16 buffers are uint16_t (the bits of quiver::bf16).
inline const uint16_t* bf16_in(const Tensor& t) { return static_cast<const uint16_t*>(t.raw()); }
inline uint16_t* bf16_out(Tensor& t) { return static_cast<uint16_t*>(t.raw()); }
inline const float* f32_in(const Tensor& t) { return static_cast<const float*>(t.raw()); }
inline float* f32_out(Tensor& t) { return static_cast<float*>(t.raw()); }

// Calls launch.operator()<P>(args, stream) for the head width Dh rounded up to P, a multiple
// of 16 up to 128 (the instantiations the tiled kernels provide).
template <class Args, class Launch>
void dispatch_padded_width(int64_t Dh, const Args& args, cudaStream_t stream, Launch launch, const char* op) {
  switch ((Dh + 15) / 16) {
    case 1: return launch.template operator()<16>(args, stream);
    case 2: return launch.template operator()<32>(args, stream);
    case 3: return launch.template operator()<48>(args, stream);
    case 4: return launch.template operator()<64>(args, stream);
    case 5: return launch.template operator()<80>(args, stream);
    case 6: return launch.template operator()<96>(args, stream);
    case 7: return launch.template operator()<112>(args, stream);
    case 8: return launch.template operator()<128>(args, stream);
    default: fail("{}: unsupported head width {}", op, Dh);
  }
}

}  // namespace quiver::cuda

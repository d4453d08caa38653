// Every CUDA call is checked; failures throw quiver::Error naming the call and the place.
// Usable in .cu files: the message is formatted in check.cpp (nvcc cannot compile fmt's
// consteval format strings, so .cu files do not instantiate quiver::fail).
#pragma once
#include <cuda_runtime.h>

namespace quiver::cuda {
[[noreturn]] void throw_cuda_error(int code, const char* what, const char* call, const char* file, int line);
}  // namespace quiver::cuda

#define QV_CUDA_CHECK(call)                                                                       \
  do {                                                                                            \
    cudaError_t err_ = (call);                                                                    \
    if (err_ != cudaSuccess)                                                                      \
      ::quiver::cuda::throw_cuda_error(static_cast<int>(err_), cudaGetErrorString(err_), #call,  \
                                       __FILE__, __LINE__);                                       \
  } while (0)

#include "cuda/backend.h"

#include "core/device_alloc.h"
#include "cuda/check.h"

namespace quiver::cuda {

namespace {
void* allocate(size_t bytes) {
  void* p = nullptr;
  QV_CUDA_CHECK(cudaMalloc(&p, bytes ? bytes : 1));
  return p;
}
void release(void* p) { cudaFree(p); }
// A tensor's memset or copy is complete when it returns. cudaMemset and device-to-device
// cudaMemcpy are asynchronous, and a pageable host-to-device cudaMemcpy may return before its
// DMA lands; all run on the legacy stream, which kernels on a non-blocking stream (the model's)
// are not ordered after. So the legacy stream is waited for.
void memset_zero(void* p, size_t bytes) {
  QV_CUDA_CHECK(cudaMemset(p, 0, bytes));
  QV_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
}
void copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  cudaMemcpyKind kind = dst_device == Device::CUDA
                            ? (src_device == Device::CUDA ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                            : cudaMemcpyDeviceToHost;
  QV_CUDA_CHECK(cudaMemcpy(dst, src, bytes, kind));
  if (dst_device == Device::CUDA) QV_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
}
}  // namespace

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

void register_backend() {
  detail::DeviceHooks hooks;
  hooks.allocate = allocate;
  hooks.release = release;
  hooks.memset_zero = memset_zero;
  hooks.copy = copy;
  detail::register_device_hooks(hooks);
}

const char* device_name() {
  static cudaDeviceProp prop;
  if (device_count() == 0) return "none";
  int dev = 0;
  QV_CUDA_CHECK(cudaGetDevice(&dev));
  QV_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  return prop.name;
}

}  // namespace quiver::cuda

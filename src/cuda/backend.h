// The CUDA backend's entry points. Call register_backend() once before creating CUDA
// tensors; it installs the allocator and copies behind Tensor (core/device_alloc.h).
#pragma once

namespace quiver::cuda {

int device_count();          // 0 when no driver or GPU is present (never throws)
void register_backend();     // idempotent
const char* device_name();   // name of the current device, or "none"

}  // namespace quiver::cuda

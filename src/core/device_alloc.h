// The seam between the CPU library and the CUDA backend: the backend registers its
// allocator and copy functions at start-up; without it, CUDA tensors are an error.
#pragma once
#include <cstddef>
#include <memory>

#include "quiver/dtype.h"

namespace quiver::detail {

struct DeviceHooks {
  void* (*allocate)(size_t bytes) = nullptr;
  void (*release)(void* p) = nullptr;
  void (*memset_zero)(void* p, size_t bytes) = nullptr;
  void (*copy)(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) = nullptr;
};

void register_device_hooks(const DeviceHooks& hooks);
std::shared_ptr<void> device_allocate(size_t bytes);
void device_memset_zero(void* p, size_t bytes);
void device_copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);

}  // namespace quiver::detail

#include "core/device_alloc.h"

#include "quiver/error.h"

namespace quiver::detail {
namespace {
DeviceHooks& hooks() {
  static DeviceHooks h;
  return h;
}
void require_backend() {
  QV_CHECK(hooks().allocate != nullptr,
           "this build of quiver has no CUDA backend (rebuild with nvcc available)");
}
}  // namespace

void register_device_hooks(const DeviceHooks& h) { hooks() = h; }

std::shared_ptr<void> device_allocate(size_t bytes) {
  require_backend();
  void* p = hooks().allocate(bytes);
  auto release = hooks().release;
  return std::shared_ptr<void>(p, [release](void* q) { release(q); });
}

void device_memset_zero(void* p, size_t bytes) {
  require_backend();
  hooks().memset_zero(p, bytes);
}

void device_copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  require_backend();
  hooks().copy(dst, dst_device, src, src_device, bytes);
}

}  // namespace quiver::detail

// Programmatic dependent launch (sm_90). A kernel launched with
// cudaLaunchAttributeProgrammaticStreamSerialization may start while the kernel before it on the
// stream still runs: it must call pdl_wait() before it reads that kernel's outputs or writes
// anything (the wait returns once the previous grid has completed and its writes are visible).
// pdl_trigger() lets the next such kernel start before this one ends. Both are no-ops for kernels
// launched without the attribute.
#pragma once
#include <cuda_runtime.h>

namespace quiver::cuda::detail {

// The launch attribute that makes a kernel a programmatic dependent (cudaLaunchKernelEx).
inline cudaLaunchAttribute pdl_attribute() {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  return attr;
}

__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }

}  // namespace quiver::cuda::detail

// Per-device CUDA context: the cuBLASLt handle and the GEMM workspace, created lazily on first
// use of a device and destroyed at program exit.
//
// Contract: the workspace is shared by every GEMM on the device, whatever the stream, and by
// the parameter sums of the norm, Givens and retention-gate backwards. GEMMs on
// one stream are ordered, so sharing is safe there; callers that run GEMMs on several streams
// concurrently must order those streams (an event) or the GEMMs may corrupt each other's
// workspace. Creating the context allocates (cudaMalloc), which a CUDA graph capture forbids:
// call context() (or run one GEMM of each shape) before capturing.
#pragma once
#include <cstddef>
#include <cstdint>

#include <cublasLt.h>
#include <cuda_runtime.h>

namespace quiver::cuda {

// Throws quiver::Error naming the cuBLAS status, the call and the place.
[[noreturn]] void throw_cublas_error(int status, const char* call, const char* file, int line);

class Context {
 public:
  static constexpr size_t kWorkspaceBytes = size_t{32} << 20;

  explicit Context(int device);  // makes `device` current while creating its resources
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  int device() const { return device_; }
  cublasLtHandle_t lt() const { return lt_; }
  void* workspace() const { return workspace_; }
  size_t workspace_bytes() const { return kWorkspaceBytes; }
  // Stream-ordered scratch of at least `bytes` for the flash backward's row terms and its
  // one-pass dQ sums, grown on demand (cudaFree, which waits for queued work, then cudaMalloc: not
  // while capturing a graph) and never shrunk; its contents do not outlive the call that asked.
  void* flash_scratch(size_t bytes);

 private:
  int device_;
  cublasLtHandle_t lt_ = nullptr;
  void* workspace_ = nullptr;
  void* flash_scratch_ = nullptr;
  size_t flash_scratch_bytes_ = 0;
};

// The context of the current device (cudaGetDevice), created on first call. Thread-safe.
Context& context();

// The flash backward's dQ (attention and FlashRelation). Off (the default): a second tile pass
// per query tile recomputes the scores and owns each dq row, so results are bitwise
// reproducible. On: the dK/dV pass also adds each tile's dS·K into fp32 sums (bulk reductions
// at L2) and a row pass rounds them: the score rule runs once instead of twice, but the order of
// the additions, so dq's last bits, vary from run to run. Head widths that are not a multiple
// of 8 or are above 96 keep the two passes (attention_launch.h, flash_dq_one_pass). Starts from QUIVER_FLASH_DQ=atomic (anything else: off).
bool flash_dq_atomics();
void set_flash_dq_atomics(bool on);

}  // namespace quiver::cuda

#define QV_CUBLAS_CHECK(call)                                                               \
  do {                                                                                      \
    cublasStatus_t status_ = (call);                                                        \
    if (status_ != CUBLAS_STATUS_SUCCESS)                                                   \
      ::quiver::cuda::throw_cublas_error(static_cast<int>(status_), #call, __FILE__, __LINE__); \
  } while (0)

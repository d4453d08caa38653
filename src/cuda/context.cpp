#include "cuda/context.h"

#include <atomic>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cuda/check.h"
#include "quiver/error.h"

namespace quiver::cuda {

void throw_cublas_error(int status, const char* call, const char* file, int line) {
  const auto s = static_cast<cublasStatus_t>(status);
  fail("cuBLAS error {} ({}: {}) in {} at {}:{}", status, cublasLtGetStatusName(s),
       cublasLtGetStatusString(s), call, file, line);
}

Context::Context(int device) : device_(device) {
  int previous = 0;
  QV_CUDA_CHECK(cudaGetDevice(&previous));
  QV_CUDA_CHECK(cudaSetDevice(device));
  QV_CUBLAS_CHECK(cublasLtCreate(&lt_));
  QV_CUDA_CHECK(cudaMalloc(&workspace_, kWorkspaceBytes));
  QV_CUDA_CHECK(cudaSetDevice(previous));
}

// Unchecked on purpose: at exit the CUDA runtime may already be shutting down, and a
// destructor must not throw.
Context::~Context() {
  if (flash_scratch_) cudaFree(flash_scratch_);
  if (workspace_) cudaFree(workspace_);
  if (lt_) cublasLtDestroy(lt_);
}

void* Context::flash_scratch(size_t bytes) {
  if (bytes > flash_scratch_bytes_) {
    if (flash_scratch_) QV_CUDA_CHECK(cudaFree(flash_scratch_));
    flash_scratch_ = nullptr;
    flash_scratch_bytes_ = 0;
    QV_CUDA_CHECK(cudaMalloc(&flash_scratch_, bytes));
    flash_scratch_bytes_ = bytes;
  }
  return flash_scratch_;
}

namespace {
bool env_is(const char* name, const char* value) {
  const char* env = std::getenv(name);
  return env != nullptr && std::string(env) == value;
}
std::atomic<bool>& flash_dq_atomics_flag() {
  static std::atomic<bool> on{env_is("QUIVER_FLASH_DQ", "atomic")};
  return on;
}
}  // namespace

bool flash_dq_atomics() { return flash_dq_atomics_flag().load(); }
void set_flash_dq_atomics(bool on) { flash_dq_atomics_flag().store(on); }

Context& context() {
  static std::mutex mutex;
  static std::vector<std::unique_ptr<Context>> contexts;  // indexed by device ordinal
  int device = 0;
  QV_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mutex);
  if (static_cast<size_t>(device) >= contexts.size()) contexts.resize(static_cast<size_t>(device) + 1);
  auto& slot = contexts[static_cast<size_t>(device)];
  if (!slot) slot = std::make_unique<Context>(device);
  return *slot;
}

}  // namespace quiver::cuda

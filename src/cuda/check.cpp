#include "cuda/check.h"

#include "quiver/error.h"

namespace quiver::cuda {

void throw_cuda_error(int code, const char* what, const char* call, const char* file, int line) {
  fail("CUDA error {} ({}) in {} at {}:{}", code, what, call, file, line);
}

}  // namespace quiver::cuda

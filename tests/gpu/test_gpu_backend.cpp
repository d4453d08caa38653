// GPU tests: label gpu; each skips cleanly when no GPU is present.
#include <gtest/gtest.h>

#include "cuda/backend.h"
#include "gpu/gpu_testing.h"
#include "quiver/rng.h"
#include "quiver/tensor.h"

using namespace quiver;
using namespace quiver::gpu_testing;

TEST(GpuBackend, TensorRoundTripThroughDeviceMemory) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  Rng rng(1);
  for (DType dt : {DType::F32, DType::F64, DType::BF16}) {
    Tensor host = Tensor::empty({37, 5}, dt);
    rng.fill_normal(host);
    Tensor dev = Tensor::empty({37, 5}, dt, Device::CUDA);
    dev.copy_from(host);
    Tensor dev2 = Tensor::zeros({37, 5}, dt, Device::CUDA);
    dev2.copy_from(dev);
    Tensor back = Tensor::zeros({37, 5}, dt);
    back.copy_from(dev2);
    EXPECT_EQ(rel_error(back, host), 0.0) << dtype_name(dt);
  }
  EXPECT_STRNE(cuda::device_name(), "none");
}

// The TMA row pass's forward with parts of its work switched off, to see which part sets its time
// (docs/decisions.md, "What the row pass's time is made of"). Built once per ablation
// (CMakeLists.txt, QUIVER_TMA_ABLATION): quiver_tma_ablation links the library's kernels as they
// are; quiver_tma_ablation_<parts> compiles src/cuda/algproj_tma.cu again with
// QUIVER_TMA_ABLATE_LOADS (the producer arrives on each stage without loading it: the products
// read stale shared memory), _PRODUCTS (no wgmma) and/or _STORES (no epilogue) defined. Their
// outputs are wrong by design: only the times mean anything.
//
//   quiver_tma_ablation[_<parts>] K N q M CONFIG...
//
// For Q_q with equal groups and cyclic rows, each configuration (an index of kAlgTmaConfigs, or
// p and an index of kAlgPairConfigs for the pair kernel, which the ablations leave as it is)
// pinned in turn: the median and the minimum of 15 batches of 50 back-to-back forwards.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cuda/algproj.h"
#include "cuda/algproj_fused_launch.h"
#include "cuda/backend.h"
#include "cuda/check.h"
#include "quiver/tensor.h"

using namespace quiver;

int main(int argc, char** argv) {
  if (argc < 6) {
    std::fprintf(stderr, "usage: %s K N q M CONFIG...\n", argv[0]);
    return 2;
  }
  const int K = std::atoi(argv[1]), N = std::atoi(argv[2]), q = std::atoi(argv[3]), M = std::atoi(argv[4]);
  if (K <= 0 || N <= 0 || q <= 0 || M <= 0 || K % q != 0 || N % q != 0) {
    std::fprintf(stderr, "K, N, q and M must be positive, K and N multiples of q\n");
    return 2;
  }
  try {
    cuda::register_backend();
    cuda::AlgProj gpu(algebra::Law::parse("Q" + std::to_string(q)), algebra::GroupWidths::equal(q, K, N));
    Tensor x = Tensor::empty({M, K}, DType::BF16, Device::CUDA), w = Tensor::empty({K, N}, DType::BF16, Device::CUDA);
    Tensor y = Tensor::empty({M, N}, DType::BF16, Device::CUDA);
    QV_CUDA_CHECK(cudaMemset(x.raw(), 0x3c, x.nbytes()));  // bf16 0x3c3c: about 0.0115, finite
    QV_CUDA_CHECK(cudaMemset(w.raw(), 0x3c, w.nbytes()));
    std::vector<int> types(M);
    for (int i = 0; i < M; ++i) types[i] = i % q;
    cudaEvent_t a, b;
    QV_CUDA_CHECK(cudaEventCreate(&a));
    QV_CUDA_CHECK(cudaEventCreate(&b));
    for (int arg = 5; arg < argc; ++arg) {
      const bool pair = argv[arg][0] == 'p';
      const int config = std::atoi(argv[arg] + (pair ? 1 : 0));
      const int count = pair ? cuda::detail::kAlgPairConfigCount : cuda::detail::kAlgTmaConfigCount;
      if (config < 0 || config >= count) {
        std::fprintf(stderr, "no %s configuration %s (0 .. %d)\n", pair ? "pair" : "TMA", argv[arg], count - 1);
        return 2;
      }
      const cuda::AlgKernel k{pair ? cuda::AlgKernel::Kind::Pair : cuda::AlgKernel::Kind::Tma, config};
      gpu.set_kernels({k, std::nullopt, std::nullopt});
      gpu.forward(x, w, types, y);  // the plan, once
      QV_CUDA_CHECK(cudaDeviceSynchronize());
      constexpr int kBatch = 50;
      std::vector<float> us;
      for (int r = 0; r < 15; ++r) {
        QV_CUDA_CHECK(cudaEventRecord(a));
        for (int i = 0; i < kBatch; ++i) gpu.forward(x, w, types, y);
        QV_CUDA_CHECK(cudaEventRecord(b));
        QV_CUDA_CHECK(cudaEventSynchronize(b));
        float ms = 0;
        QV_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
        us.push_back(1000.0f * ms / kBatch);
      }
      std::sort(us.begin(), us.end());
      std::printf("K=%d N=%d q=%d M=%d  %-44s median %8.2f us  min %8.2f us\n", K, N, q, M,
                  cuda::kernel_name(ops::AlgPass::Forward, k).c_str(), us[us.size() / 2], us[0]);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}

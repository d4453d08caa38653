#include "cuda/sampler.h"

#include "cuda/sampler_launch.h"
#include "quiver/error.h"

namespace quiver::cuda {

void sample_tokens(const Tensor& logits, const infer::SamplerOptions& options, const uint64_t* seeds,
                   const int32_t* pos, int64_t origin, int32_t* tokens, int32_t* history,
                   int64_t history_stride, cudaStream_t stream) {
  const char* op = "cuda::sample_tokens";
  QV_CHECK(logits.device() == Device::CUDA && logits.is_contiguous(), "{}: logits must be a contiguous CUDA tensor",
           op);
  check_dtype(logits, DType::BF16, "logits");
  check_ndim(logits, 2, "logits");
  QV_CHECK(logits.dim(1) >= 1 && logits.dim(1) < (int64_t{1} << 31), "{}: vocabulary of {} tokens", op,
           logits.dim(1));
  QV_CHECK(seeds && pos && tokens, "{}: seeds, pos and tokens must be device pointers", op);
  options.validate();
  detail::SampleArgs a;
  a.logits = static_cast<const uint16_t*>(logits.raw());
  a.B = logits.dim(0);
  a.V = logits.dim(1);
  a.greedy = options.is_greedy();
  a.inv_temperature = a.greedy ? 1.0f : static_cast<float>(1.0 / options.temperature);
  a.top_k = options.top_k;
  a.top_p = options.top_p;
  a.seeds = seeds;
  a.pos = pos;
  a.origin = origin;
  a.tokens = tokens;
  a.history = history;
  a.history_stride = history_stride;
  detail::launch_sample(a, stream);
}

}  // namespace quiver::cuda

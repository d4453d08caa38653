#include "cuda/generate.h"

#include <algorithm>
#include <chrono>

#include "cuda/check.h"
#include "cuda/sampler.h"
#include "quiver/error.h"

namespace quiver::cuda {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

bool same_distribution(const infer::SamplerOptions& a, const infer::SamplerOptions& b) {
  return a.temperature == b.temperature && a.top_k == b.top_k && a.top_p == b.top_p && a.is_greedy() == b.is_greedy();
}

// A captured step (decode + sample) per row type.
struct StepGraphs {
  std::vector<cudaGraphExec_t> exec;
  std::vector<bool> warmed;
  explicit StepGraphs(int types) : exec(types, nullptr), warmed(types, false) {}
  ~StepGraphs() {
    for (cudaGraphExec_t g : exec)
      if (g) cudaGraphExecDestroy(g);
  }
};

}  // namespace

std::vector<infer::TokenCompletion> generate_tokens(
    GpuModel& model, const std::vector<std::vector<int32_t>>& prompts, int64_t max_new_tokens,
    const std::vector<infer::Sampler>& samplers, const std::vector<int32_t>& stop_ids,
    const std::function<bool(size_t, const std::vector<int32_t>&)>& stop_check, infer::DecodeTiming* timing,
    const GpuGenerateOptions& options) {
  const std::vector<int32_t> flat =
      infer::flatten_batch(prompts, samplers.size(), max_new_tokens, model.config().context);
  const int64_t B = static_cast<int64_t>(prompts.size()), L = static_cast<int64_t>(prompts[0].size());
  QV_CHECK(options.read_every >= 1, "generate: read_every must be ≥ 1, got {}", options.read_every);
  const infer::SamplerOptions& sampling = samplers[0].options();
  for (const infer::Sampler& s : samplers)
    QV_CHECK(same_distribution(s.options(), sampling),
             "generate on the GPU: the rows of one batch must share temperature, top-k, top-p and greedy");
  infer::DecodeTiming local;
  infer::DecodeTiming& time = timing ? *timing : local;
  const cudaStream_t stream = model.stream();

  auto state = model.new_decode_state(B, L + max_new_tokens - 1);

  // Device buffers: per-row seeds and the history of new tokens [B, max_new].
  std::vector<uint64_t> seeds(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) seeds[b] = samplers[b].options().seed;
  Tensor seeds_dev = Tensor::empty({B}, DType::F64, Device::CUDA);  // 8-byte storage for uint64
  QV_CUDA_CHECK(cudaMemcpyAsync(seeds_dev.raw(), seeds.data(), sizeof(uint64_t) * B, cudaMemcpyHostToDevice, stream));
  Tensor history_dev = Tensor::zeros({B * max_new_tokens}, DType::F32, Device::CUDA);  // int32 storage
  const uint64_t* seeds_ptr = static_cast<const uint64_t*>(seeds_dev.raw());
  int32_t* history = static_cast<int32_t*>(history_dev.raw());
  int32_t* host_history = nullptr;
  QV_CUDA_CHECK(cudaMallocHost(&host_history, sizeof(int32_t) * static_cast<size_t>(B * max_new_tokens)));
  struct PinnedFree {
    int32_t* p;
    ~PinnedFree() { cudaFreeHost(p); }
  } pinned_guard{host_history};

  // Profiling (model.timer()) records events between ops, which a graph capture cannot hold.
  const bool use_graphs = options.graphs && !model.timer().enabled();
  auto sample = [&] {
    model.timer().mark("sampling", stream);
    sample_tokens(state->logits(), sampling, seeds_ptr, state->device_position(), L, state->tokens(), history,
                  max_new_tokens, stream);
    model.timer().stop(stream);
  };

  Clock::time_point t0 = Clock::now();
  model.prefill(*state, flat.data(), B, L);
  time.prefill_s += seconds_since(t0);

  std::vector<infer::TokenCompletion> out(static_cast<size_t>(B));
  std::vector<bool> done(static_cast<size_t>(B), false);
  int64_t active = B, read = 0;
  StepGraphs graphs(model.decode_row_types());

  t0 = Clock::now();
  sample();  // the first new token, from the prompt's logits
  int64_t produced = 1;
  auto read_and_check = [&] {
    for (int64_t b = 0; b < B; ++b)
      QV_CUDA_CHECK(cudaMemcpyAsync(host_history + b * max_new_tokens + read, history + b * max_new_tokens + read,
                                    sizeof(int32_t) * static_cast<size_t>(produced - read), cudaMemcpyDeviceToHost,
                                    stream));
    QV_CUDA_CHECK(cudaStreamSynchronize(stream));
    time.decode_s += seconds_since(t0);
    const Clock::time_point tc = Clock::now();
    for (int64_t b = 0; b < B; ++b) {
      if (done[b]) continue;
      infer::TokenCompletion& c = out[b];
      for (int64_t i = read; i < produced && !done[b]; ++i) {
        c.tokens.push_back(host_history[b * max_new_tokens + i]);
        bool stop = false;
        if (std::find(stop_ids.begin(), stop_ids.end(), c.tokens.back()) != stop_ids.end()) {
          c.reason = infer::StopReason::StopToken;
          stop = true;
        } else if (stop_check && stop_check(static_cast<size_t>(b), c.tokens)) {
          c.reason = infer::StopReason::StopString;
          stop = true;
        } else if (static_cast<int64_t>(c.tokens.size()) == max_new_tokens) {
          c.reason = infer::StopReason::MaxTokens;
          stop = true;
        }
        if (stop) {
          done[b] = true;
          --active;
        }
      }
    }
    read = produced;
    time.stop_check_s += seconds_since(tc);
    t0 = Clock::now();
  };

  while (true) {
    if (produced - read >= options.read_every || produced == max_new_tokens) read_and_check();
    if (active == 0 || produced == max_new_tokens) break;
    // Finished rows keep feeding their last token; what they draw is never read.
    const int type = model.decode_row_type(state->position());
    if (!use_graphs || !graphs.warmed[type]) {
      model.decode_step(*state);  // the first step of a type warms its plans and scratch
      sample();
      graphs.warmed[type] = true;
    } else {
      if (!graphs.exec[type]) {
        cudaGraph_t graph = nullptr;
        QV_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
        model.decode_step(*state);
        sample();
        QV_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
        const cudaError_t err = cudaGraphInstantiate(&graphs.exec[type], graph, 0);
        cudaGraphDestroy(graph);
        QV_CUDA_CHECK(err);
      } else {
        state->count_replayed_step();
      }
      QV_CUDA_CHECK(cudaGraphLaunch(graphs.exec[type], stream));
    }
    ++produced;
  }
  return out;
}

}  // namespace quiver::cuda

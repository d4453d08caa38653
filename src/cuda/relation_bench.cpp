// bench_relation_cuda (relation_bench.h).
#include "cuda/relation_bench.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include <cuda_runtime.h>

#include "cuda/attention.h"
#include "cuda/bench_stats.h"
#include "cuda/check.h"
#include "cuda/context.h"
#include "cuda/relation.h"
#include "ops/attention.h"
#include "ops/relation.h"
#include "quiver/error.h"
#include "quiver/rng.h"
#include "quiver/tensor.h"

namespace quiver::cuda {
namespace {

using detail::median;

constexpr float kLambda = 0.5f;
constexpr double kBound = 4.0 / 256.0;  // 4 bf16 unit roundoffs

Tensor random_device_bf16(const Shape& shape, Rng& rng, double lo, double hi) {
  Tensor host = Tensor::empty(shape, DType::F32);
  rng.fill_uniform(host, lo, hi);
  Tensor dev = Tensor::empty(shape, DType::BF16, Device::CUDA);
  dev.copy_from(host.to(DType::BF16));
  return dev;
}

// Head 0 of batch 0 of a [B, T, H, Dh] bf16 device tensor as a float64 [1, T, 1, Dh] host
// tensor (only its T rows cross the bus).
Tensor head0_f64(const Tensor& dev) {
  const int64_t T = dev.dim(1), H = dev.dim(2), Dh = dev.dim(3);
  Tensor host = Tensor::empty({1, T, 1, Dh}, DType::BF16);
  QV_CUDA_CHECK(cudaMemcpy2D(host.raw(), Dh * 2, dev.raw(), H * Dh * 2, Dh * 2, T, cudaMemcpyDeviceToHost));
  return host.to(DType::F64);
}

enum class Dq { TwoPass, OnePass };
constexpr Dq kDqModes[] = {Dq::TwoPass, Dq::OnePass};  // relation_bench_dq_modes' order
const char* dq_name(Dq dq) {
  switch (dq) {
    case Dq::TwoPass: return "two-pass";
    case Dq::OnePass: return "one-pass";
  }
  return "?";
}

// The backward mode for the scope's lifetime; the previous one after.
class DqMode {
 public:
  explicit DqMode(Dq dq) : one_pass_(flash_dq_atomics()) { set_flash_dq_atomics(dq == Dq::OnePass); }
  ~DqMode() { set_flash_dq_atomics(one_pass_); }
  DqMode(const DqMode&) = delete;
  DqMode& operator=(const DqMode&) = delete;

 private:
  bool one_pass_;
};

struct Variant {
  bool relation;
  Dq dq;
  std::vector<float> forward_ms, backward_ms;
};

class ShapeBench {
 public:
  ShapeBench(const RelationBenchShape& s, Rng& rng) : shape_{s.B, s.T, s.H, s.Dh} {
    p1_ = random_device_bf16(shape_, rng, -2.0, 2.0);
    p2_ = random_device_bf16(shape_, rng, -2.0, 2.0);
    v_ = random_device_bf16(shape_, rng, -1.0, 1.0);
    dy_ = random_device_bf16(shape_, rng, -1.0, 1.0);
    auto out = [&] { return Tensor::empty(shape_, DType::BF16, Device::CUDA); };
    y_ = out();
    dp1_ = out();
    dp2_ = out();
    dv_ = out();
    stats_ = Tensor::empty({s.B, s.H, s.T, 3}, DType::F32, Device::CUDA);
    lse_ = Tensor::empty({s.B, s.H, s.T}, DType::F32, Device::CUDA);
    const int64_t bytes = flash_relation_backward_workspace_bytes(s.B, s.T, s.H);
    workspace_ = Tensor::empty({(bytes + 7) / 8}, DType::F64, Device::CUDA);
    lambda_ = Tensor::empty({1}, DType::F32, Device::CUDA);
    dlambda_ = Tensor::zeros({1}, DType::F32, Device::CUDA);
    const float lambda = kLambda;
    QV_CUDA_CHECK(cudaMemcpy(lambda_.raw(), &lambda, sizeof(float), cudaMemcpyHostToDevice));
    QV_CUDA_CHECK(cudaEventCreate(&start_));
    QV_CUDA_CHECK(cudaEventCreate(&stop_));
  }
  ~ShapeBench() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  ShapeBench(const ShapeBench&) = delete;
  ShapeBench& operator=(const ShapeBench&) = delete;

  void forward(bool relation) {
    if (relation)
      flash_relation_forward(p1_, p2_, v_, lambda_.data<float>(), y_, stats_, options_);
    else
      attention_forward(p1_, p2_, v_, y_, lse_);
  }
  void backward(bool relation) {
    if (relation)
      flash_relation_backward(p1_, p2_, v_, lambda_.data<float>(), y_, stats_, dy_, dp1_, dp2_, dv_,
                              dlambda_.data<float>(), options_, workspace_);
    else
      attention_backward(p1_, p2_, v_, y_, lse_, dy_, dp1_, dp2_, dv_);
  }

  // The mean time of `repeat` calls, in ms.
  float time_calls(const std::function<void()>& call, int repeat) {
    QV_CUDA_CHECK(cudaEventRecord(start_));
    for (int r = 0; r < repeat; ++r) call();
    QV_CUDA_CHECK(cudaEventRecord(stop_));
    QV_CUDA_CHECK(cudaEventSynchronize(stop_));
    float ms = 0;
    QV_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
    return ms / static_cast<float>(repeat);
  }

  // One forward and backward of the variant, then head 0 against the float64 CPU flash op.
  double check(const Variant& v) {
    const DqMode mode(v.dq);
    forward(v.relation);
    backward(v.relation);
    const Tensor y = head0_f64(y_);
    Reference& ref = v.relation ? relation_ref_ : attention_ref_;
    if (!ref.ready) reference(v.relation, y, ref);
    return std::max({rel_error(y, ref.y), rel_error(head0_f64(dp1_), ref.d1), rel_error(head0_f64(dp2_), ref.d2),
                     rel_error(head0_f64(dv_), ref.dv)});
  }

 private:
  struct Reference {
    bool ready = false;
    Tensor y, d1, d2, dv;
  };
  // The CPU flash op on head 0 in float64; the backward fed the GPU's y (`y_got`).
  void reference(bool relation, const Tensor& y_got, Reference& ref) {
    const Tensor p1 = head0_f64(p1_), p2 = head0_f64(p2_), v = head0_f64(v_), dy = head0_f64(dy_);
    Tensor aux;
    if (relation) {
      ops::flash_relation_forward(p1, p2, v, kLambda, ref.y, aux);
      ops::flash_relation_backward(p1, p2, v, kLambda, y_got, aux, dy, ref.d1, ref.d2, ref.dv);
    } else {
      ops::attention_forward(p1, p2, v, ref.y, aux);
      ops::attention_backward(p1, p2, v, y_got, aux, dy, ref.d1, ref.d2, ref.dv);
    }
    ref.ready = true;
  }

  Shape shape_;
  Tensor p1_, p2_, v_, dy_, y_, dp1_, dp2_, dv_, stats_, lse_, workspace_, lambda_, dlambda_;
  RelationKernelOptions options_;
  Reference relation_ref_, attention_ref_;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

}  // namespace

std::vector<RelationBenchRow> bench_relation_cuda(const RelationBenchOptions& options) {
  QV_CHECK(options.runs >= 3, "bench relation: at least 3 trials, got {}", options.runs);
  QV_CHECK(options.repeat >= 1, "bench relation: repeat must be positive, got {}", options.repeat);
  std::vector<Dq> modes;
  for (const std::string& name : options.dq) {
    bool known = false;
    for (Dq dq : kDqModes)
      if (name == dq_name(dq)) {
        modes.push_back(dq);
        known = true;
      }
    QV_CHECK(known, "bench relation: no dQ mode '{}' ({})", name, fmt::join(relation_bench_dq_modes(), ", "));
  }
  QV_CHECK(!modes.empty(), "bench relation: no dQ mode to time");
  std::vector<RelationBenchRow> rows;
  Rng rng(20261201);
  for (const RelationBenchShape& s : options.shapes) {
    QV_CHECK(s.B > 0 && s.T > 0 && s.H > 0 && s.Dh > 0, "bench relation: shape {} needs positive B, T, H, Dh",
             s.scale);
    ShapeBench bench(s, rng);
    std::vector<Variant> variants;
    for (bool relation : {true, false})
      for (Dq dq : modes) variants.push_back({relation, dq, {}, {}});
    for (Variant& v : variants) {  // warm-up: kernels loaded, the one-pass scratch allocated
      const DqMode mode(v.dq);
      bench.forward(v.relation);
      bench.backward(v.relation);
    }
    QV_CUDA_CHECK(cudaDeviceSynchronize());
    for (int run = 0; run < options.runs; ++run)
      for (Variant& v : variants) {
        const DqMode mode(v.dq);
        v.forward_ms.push_back(bench.time_calls([&] { bench.forward(v.relation); }, options.repeat));
        v.backward_ms.push_back(bench.time_calls([&] { bench.backward(v.relation); }, options.repeat));
      }
    for (const Variant& v : variants) {
      RelationBenchRow row;
      row.scale = s.scale;
      row.B = s.B;
      row.T = s.T;
      row.H = s.H;
      row.Dh = s.Dh;
      row.mixer = v.relation ? "flash_relation" : "attention";
      row.dq = dq_name(v.dq);
      row.forward_ms = median(v.forward_ms);
      row.backward_ms = median(v.backward_ms);
      row.total_ms = row.forward_ms + row.backward_ms;
      row.tok_s = static_cast<double>(s.B * s.T) / (row.total_ms * 1e-3);
      if (options.check) {
        row.rel_error = bench.check(v);
        row.correct = row.rel_error <= kBound;
      }
      rows.push_back(row);
    }
  }
  return rows;
}

}  // namespace quiver::cuda

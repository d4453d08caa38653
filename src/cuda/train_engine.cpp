#include "cuda/train_engine.h"

#include <memory>

#include "cuda/backend.h"
#include "cuda/check.h"
#include "cuda/model.h"
#include "cuda/nccl.h"
#include "cuda/ops.h"
#include "train/engine.h"

namespace quiver::cuda {

namespace {

// With world > 1, one rank of a data-parallel run (train/engine.h): each process drives the
// one GPU it sees. The ranks start from rank 0's parameters (broadcast), and before each
// optimizer step the flat gradient buffer is averaged over the ranks together with the loss, so
// clipping and AdamW see the global-batch gradient and every rank makes the same update. The
// all-reduce runs after the backward, on the model's stream; overlapping it with the backward
// (per train::bucket_plan bucket) and sharding the optimizer state (ZeRO-1) are not done yet.
class CudaEngine final : public train::Engine {
 public:
  CudaEngine(model::Model& host, train::AdamW& adam, const train::Parallel& parallel)
      : host_(host),
        adam_(adam),
        model_(host.config()),
        segments_(adam.segments(), adam.num_params()),
        step_(adam.steps_taken()) {
    QV_CHECK(host.dtype() == DType::F32, "the GPU engine trains from an F32 host model, got {}",
             dtype_name(host.dtype()));
    model_.load_params(host.params());
    m_ = Tensor::empty({adam.num_params()}, DType::F32, Device::CUDA);
    v_ = Tensor::empty({adam.num_params()}, DType::F32, Device::CUDA);
    m_.copy_from(adam.m());
    v_.copy_from(adam.v());
    norm_ = Tensor::zeros({1}, DType::F32, Device::CUDA);
    flag_ = Tensor::zeros({1}, DType::F32, Device::CUDA);
    QV_CUDA_CHECK(cudaMallocHost(&norm_host_, sizeof(float)));
    QV_CUDA_CHECK(cudaMallocHost(&flag_host_, sizeof(float)));
    if (parallel.world > 1) {
      comm_ = std::make_unique<Communicator>(parallel.rank, parallel.world, parallel.rendezvous);
      const cudaStream_t s = model_.stream();
      comm_->broadcast(static_cast<float*>(model_.params().raw()), static_cast<size_t>(model_.params().numel()), s);
      model_.params_changed();
      QV_CUDA_CHECK(cudaStreamSynchronize(s));
    }
  }
  ~CudaEngine() override {
    if (norm_host_) cudaFreeHost(norm_host_);
    if (flag_host_) cudaFreeHost(flag_host_);
  }

  std::string description() const override { return device_name(); }

  void zero_grads() override { model_.zero_grads(); }
  // The GPU model, for profiling (bench model --profile).
  GpuModel& model() { return model_; }
  void forward_backward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T,
                        float grad_scale) override {
    model_.forward_backward(tokens, targets, B, T, grad_scale);
  }
  StepResult optimizer_step(double lr, double clip) override {
    const cudaStream_t s = model_.stream();
    if (comm_) {
      model_.timer().mark("gradient all-reduce", s);
      comm_->group_start();
      comm_->all_reduce_mean(static_cast<float*>(model_.grads().raw()), static_cast<size_t>(model_.grads().numel()), s);
      comm_->all_reduce_mean(static_cast<float*>(model_.loss_sum().raw()), 1, s);
      comm_->group_end();
    }
    model_.timer().mark("optimizer (clip, AdamW, bf16 copy)", s);
    grad_square_sum(model_.grads(), segments_, s);
    clip_to_norm(model_.grads(), segments_, clip, norm_, s);
    ++step_;
    adamw_step(model_.params(), model_.grads(), m_, v_, segments_, adam_.options(), lr, step_, s);
    model_.params_changed();
    model_.timer().stop(s);
    QV_CUDA_CHECK(cudaMemcpyAsync(norm_host_, norm_.raw(), sizeof(float), cudaMemcpyDeviceToHost, s));
    StepResult r;
    r.loss_sum = model_.take_loss_sum();  // waits for the stream, so the norm has arrived too
    r.grad_norm = *norm_host_;
    return r;
  }
  double forward_loss(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T) override {
    return model_.forward_loss(tokens, targets, B, T);
  }
  void sync_to_host() override {
    model_.store_params(host_.params());
    adam_.m().copy_from(m_);
    adam_.v().copy_from(v_);
    adam_.set_steps_taken(step_);
  }
  bool any_rank(bool flag) override {
    if (!comm_) return flag;
    const cudaStream_t s = model_.stream();
    *flag_host_ = flag ? 1.0f : 0.0f;
    QV_CUDA_CHECK(cudaMemcpyAsync(flag_.raw(), flag_host_, sizeof(float), cudaMemcpyHostToDevice, s));
    comm_->all_reduce_max(static_cast<float*>(flag_.raw()), 1, s);
    QV_CUDA_CHECK(cudaMemcpyAsync(flag_host_, flag_.raw(), sizeof(float), cudaMemcpyDeviceToHost, s));
    QV_CUDA_CHECK(cudaStreamSynchronize(s));
    return *flag_host_ != 0.0f;
  }

 private:
  model::Model& host_;
  train::AdamW& adam_;
  GpuModel model_;
  DeviceParamSegments segments_;
  int64_t step_;
  Tensor m_, v_, norm_, flag_;
  float* norm_host_ = nullptr;
  float* flag_host_ = nullptr;
  std::unique_ptr<Communicator> comm_;  // data-parallel runs only
};

std::unique_ptr<train::Engine> make_cuda_engine(model::Model& model, train::AdamW& adam,
                                                const train::Parallel& parallel) {
  QV_CHECK(device_count() > 0, "--device cuda: no CUDA device was found");
  register_backend();
  return std::make_unique<CudaEngine>(model, adam, parallel);
}

}  // namespace

OpTimer* engine_timer(train::Engine& engine) {
  auto* e = dynamic_cast<CudaEngine*>(&engine);
  return e ? &e->model().timer() : nullptr;
}

void register_train_engine() { train::register_engine("cuda", &make_cuda_engine); }

}  // namespace quiver::cuda

#include "cuda/train_engine.h"

#include <memory>

#include "cuda/backend.h"
#include "cuda/check.h"
#include "cuda/model.h"
#include "cuda/ops.h"
#include "train/engine.h"

namespace quiver::cuda {

namespace {

class CudaEngine final : public train::Engine {
 public:
  CudaEngine(model::Model& host, train::AdamW& adam)
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
    QV_CUDA_CHECK(cudaMallocHost(&norm_host_, sizeof(float)));
  }
  ~CudaEngine() override {
    if (norm_host_) cudaFreeHost(norm_host_);
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
    model_.timer().mark("optimizer (clip, AdamW, bf16 copy)", s);
    clip_grad_norm(model_.grads(), segments_, clip, norm_, s);
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

 private:
  model::Model& host_;
  train::AdamW& adam_;
  GpuModel model_;
  DeviceParamSegments segments_;
  int64_t step_;
  Tensor m_, v_, norm_;
  float* norm_host_ = nullptr;
};

std::unique_ptr<train::Engine> make_cuda_engine(model::Model& model, train::AdamW& adam) {
  QV_CHECK(device_count() > 0, "--device cuda: no CUDA device was found");
  register_backend();
  return std::make_unique<CudaEngine>(model, adam);
}

}  // namespace

OpTimer* engine_timer(train::Engine& engine) {
  auto* e = dynamic_cast<CudaEngine*>(&engine);
  return e ? &e->model().timer() : nullptr;
}

void register_train_engine() { train::register_engine("cuda", &make_cuda_engine); }

}  // namespace quiver::cuda

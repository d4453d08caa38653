#include "cuda/train_engine.h"

#include <memory>
#include <vector>

#include "cuda/backend.h"
#include "cuda/check.h"
#include "cuda/model.h"
#include "cuda/nccl.h"
#include "cuda/ops.h"
#include "train/distributed.h"
#include "train/engine.h"

namespace quiver::cuda {

namespace {

// With world > 1, one rank of a data-parallel run (train/engine.h, train/distributed.h): each
// process drives the one GPU it sees, and the ranks start from rank 0's parameters (broadcast).
//
// ZeRO-1: the rank keeps m and v only for its shard of the flat buffer (train::optimizer_shard).
// During the backward of a step's last micro-batch, each gradient bucket (train::bucket_plan) is
// reduce-scattered to the shards' owners as soon as the backward has finished it: the model
// reports each finished stage (GpuModel::GradientsFinal), the engine records an event on the
// compute stream and the communication stream waits for it before reducing the buckets that
// became complete. The optimizer step waits for the communication stream, averages the loss,
// clips with the global norm (the shards' Σ g² summed over the ranks), updates the shard and
// all-gathers the updated shards into every rank's parameters. Earlier micro-batches only
// accumulate. With world == 1 the shard is the whole buffer and no collective runs.
class CudaEngine final : public train::Engine {
 public:
  CudaEngine(model::Model& host, train::AdamW& adam, const train::Parallel& parallel)
      : host_(host),
        adam_(adam),
        model_(host.config()),
        shard_(train::optimizer_shard(adam.segments(), adam.num_params(), parallel.rank, parallel.world)),
        segments_(shard_.segments, shard_.range.size()),
        step_(adam.steps_taken()) {
    QV_CHECK(host.dtype() == DType::F32, "the GPU engine trains from an F32 host model, got {}",
             dtype_name(host.dtype()));
    model_.load_params(host.params());
    // A resumed rank takes its shard of the full state, whatever world size wrote it.
    const train::Range r = shard_.range;
    m_ = Tensor::empty({r.size()}, DType::F32, Device::CUDA);
    v_ = Tensor::empty({r.size()}, DType::F32, Device::CUDA);
    m_.copy_from(adam.m().slice(0, r.begin, r.end));
    v_.copy_from(adam.v().slice(0, r.begin, r.end));
    norm_ = Tensor::zeros({1}, DType::F32, Device::CUDA);
    flag_ = Tensor::zeros({1}, DType::F32, Device::CUDA);
    QV_CUDA_CHECK(cudaMallocHost(&norm_host_, sizeof(float)));
    QV_CUDA_CHECK(cudaMallocHost(&flag_host_, sizeof(float)));
    if (parallel.world > 1) {
      comm_ = std::make_unique<Communicator>(parallel.rank, parallel.world, parallel.rendezvous);
      for (const train::Bucket& b : train::bucket_plan(model_.param_table(), parallel.bucket_bytes)) {
        buckets_.push_back(b);
        bucket_parts_.push_back(train::split_by_shards(b.range, shard_.shards));
      }
      QV_CUDA_CHECK(cudaStreamCreateWithFlags(&comm_stream_, cudaStreamNonBlocking));
      QV_CUDA_CHECK(cudaEventCreateWithFlags(&grads_ready_, cudaEventDisableTiming));
      QV_CUDA_CHECK(cudaEventCreateWithFlags(&grads_reduced_, cudaEventDisableTiming));
      const cudaStream_t s = model_.stream();
      comm_->broadcast(static_cast<float*>(model_.params().raw()), static_cast<size_t>(model_.params().numel()), s);
      model_.params_changed();
      QV_CUDA_CHECK(cudaStreamSynchronize(s));
    }
  }
  ~CudaEngine() override {
    cudaStreamSynchronize(model_.stream());  // queued collectives may still use the buffers
    if (comm_stream_) cudaStreamSynchronize(comm_stream_);
    if (grads_ready_) cudaEventDestroy(grads_ready_);
    if (grads_reduced_) cudaEventDestroy(grads_reduced_);
    if (comm_stream_) cudaStreamDestroy(comm_stream_);
    if (norm_host_) cudaFreeHost(norm_host_);
    if (flag_host_) cudaFreeHost(flag_host_);
  }

  std::string description() const override { return device_name(); }

  void zero_grads() override { model_.zero_grads(); }
  // The GPU model, for profiling (bench model --profile).
  GpuModel& model() { return model_; }
  void forward_backward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T, float grad_scale,
                        bool last) override {
    in_step_ = true;
    if (!comm_ || !last) {
      model_.forward_backward(tokens, targets, B, T, grad_scale);
      return;
    }
    QV_CHECK(reduced_ == 0, "forward_backward: a second last micro-batch before the optimizer step");
    model_.forward_backward(tokens, targets, B, T, grad_scale,
                            [this](size_t first_final) { reduce_complete_buckets(first_final); });
  }
  StepResult optimizer_step(double lr, double clip) override {
    const cudaStream_t s = model_.stream();
    const train::Range r = shard_.range;
    Tensor grads = model_.grads().slice(0, r.begin, r.end);
    Tensor params = model_.params().slice(0, r.begin, r.end);
    if (comm_) {
      QV_CHECK(reduced_ == buckets_.size(),
               "optimizer_step: {} of {} gradient buckets were reduced (no micro-batch of the step was marked last)",
               reduced_, buckets_.size());
      model_.timer().mark("wait for the gradient reduce-scatter", s);
      QV_CUDA_CHECK(cudaEventRecord(grads_reduced_, comm_stream_));
      QV_CUDA_CHECK(cudaStreamWaitEvent(s, grads_reduced_, 0));
      comm_->all_reduce_mean(static_cast<float*>(model_.loss_sum().raw()), 1, s);
      reduced_ = 0;
    }
    model_.timer().mark("optimizer (clip, AdamW, bf16 copy)", s);
    grad_square_sum(grads, segments_, s);
    if (comm_) comm_->all_reduce_sum(segments_.square_sum(), 1, s);  // the global norm
    clip_to_norm(grads, segments_, clip, norm_, s);
    ++step_;
    adamw_step(params, grads, m_, v_, segments_, adam_.options(), lr, step_, s);
    if (comm_) {
      model_.timer().mark("parameter all-gather", s);
      comm_->all_gather(static_cast<float*>(model_.params().raw()), shard_.shards, s);
    }
    model_.params_changed();
    model_.timer().stop(s);
    QV_CUDA_CHECK(cudaMemcpyAsync(norm_host_, norm_.raw(), sizeof(float), cudaMemcpyDeviceToHost, s));
    StepResult result;
    result.loss_sum = model_.take_loss_sum();  // waits for the stream, so the norm has arrived too
    result.grad_norm = *norm_host_;
    in_step_ = false;
    return result;
  }
  double forward_loss(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T) override {
    return model_.forward_loss(tokens, targets, B, T);
  }
  void sync_to_host() override {
    QV_CHECK(!in_step_, "sync_to_host: called in the middle of a step (after forward_backward, before optimizer_step)");
    model_.store_params(host_.params());  // waits for the stream
    gather_state(m_, adam_.m());
    gather_state(v_, adam_.v());
    if (comm_) model_.zero_grads();  // the gathers borrowed the gradient buffer
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
  // The backward has enqueued the stage that finishes every gradient from table entry
  // first_final on: reduce-scatter the buckets that are now complete, on the communication
  // stream, after the compute stream has produced them.
  void reduce_complete_buckets(size_t first_final) {
    const size_t complete = train::buckets_complete(buckets_, first_final);
    if (complete == reduced_) return;
    QV_CUDA_CHECK(cudaEventRecord(grads_ready_, model_.stream()));
    QV_CUDA_CHECK(cudaStreamWaitEvent(comm_stream_, grads_ready_, 0));
    float* grads = static_cast<float*>(model_.grads().raw());
    for (; reduced_ < complete; ++reduced_) comm_->reduce_scatter_mean(grads, bucket_parts_[reduced_], comm_stream_);
  }

  // The full flat state (host F32 [P]) from every rank's shard `mine`. With several ranks the
  // shards meet in the gradient buffer, which holds nothing needed between steps, so the gather
  // needs no memory of its own.
  void gather_state(const Tensor& mine, Tensor& host) {
    if (!comm_) {
      host.copy_from(mine);
      return;
    }
    const cudaStream_t s = model_.stream();
    Tensor& full = model_.grads();
    QV_CUDA_CHECK(cudaMemcpyAsync(full.slice(0, shard_.range.begin, shard_.range.end).raw(), mine.raw(),
                                  mine.nbytes(), cudaMemcpyDeviceToDevice, s));
    comm_->all_gather(static_cast<float*>(full.raw()), shard_.shards, s);
    QV_CUDA_CHECK(cudaStreamSynchronize(s));
    host.copy_from(full);
  }

  model::Model& host_;
  train::AdamW& adam_;
  GpuModel model_;
  train::OptimizerShard shard_;
  DeviceParamSegments segments_;  // the optimizer's segments in this rank's shard
  int64_t step_;
  Tensor m_, v_, norm_, flag_;    // m_, v_: F32 [shard size]
  float* norm_host_ = nullptr;
  float* flag_host_ = nullptr;
  bool in_step_ = false;          // between the first forward_backward and the optimizer step
  // Data-parallel runs only.
  std::unique_ptr<Communicator> comm_;
  std::vector<train::Bucket> buckets_;
  std::vector<std::vector<train::Range>> bucket_parts_;  // each bucket's part in every rank's shard
  size_t reduced_ = 0;            // buckets of this step handed to the communication stream
  cudaStream_t comm_stream_ = nullptr;
  cudaEvent_t grads_ready_ = nullptr, grads_reduced_ = nullptr;
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

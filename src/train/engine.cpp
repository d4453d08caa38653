#include "train/engine.h"

#include <map>
#include <mutex>

#include "quiver/error.h"

namespace quiver::train {

namespace {

class CpuEngine final : public Engine {
 public:
  CpuEngine(model::Model& model, AdamW& adam) : model_(model), adam_(adam) {}

  std::string description() const override { return "cpu"; }

  void zero_grads() override {
    model_.grads().fill(0.0);
    loss_sum_ = 0;
  }
  void forward_backward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T,
                        float grad_scale, bool) override {
    loss_sum_ += model_.forward_backward(tokens, targets, B, T, grad_scale);
  }
  StepResult optimizer_step(double lr, double clip) override {
    float* grads = model_.grads().data<float>();
    const double norm = grad_norm(grads, adam_.segments());
    clip_grad_norm(grads, adam_.segments(), norm, clip);
    adam_.step(model_.params().data<float>(), grads, lr);
    return {loss_sum_, norm};
  }
  double forward_loss(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T) override {
    return model_.forward_loss(tokens, targets, B, T);
  }
  void sync_to_host() override {}

 private:
  model::Model& model_;
  AdamW& adam_;
  double loss_sum_ = 0;
};

std::mutex g_mutex;
std::map<std::string, EngineFactory>& factories() {
  static std::map<std::string, EngineFactory> f;
  return f;
}

}  // namespace

std::unique_ptr<Engine> make_cpu_engine(model::Model& model, AdamW& adam) {
  return std::make_unique<CpuEngine>(model, adam);
}

void register_engine(const std::string& device, EngineFactory factory) {
  std::lock_guard<std::mutex> lock(g_mutex);
  factories()[device] = factory;
}

void check_engine_device(const std::string& device) {
  if (device == "cpu") return;
  std::string known = "cpu";
  bool found = false;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    found = factories().count(device) > 0;
    for (const auto& [name, f] : factories()) known += ", " + name;
  }
  QV_CHECK(found, "training device '{}' is not available in this build (available: {})", device, known);
}

std::unique_ptr<Engine> make_engine(const std::string& device, model::Model& model, AdamW& adam,
                                    const Parallel& parallel) {
  QV_CHECK(parallel.world >= 1 && parallel.rank >= 0 && parallel.rank < parallel.world,
           "data-parallel rank {} of world {} is out of range", parallel.rank, parallel.world);
  if (device == "cpu") {
    QV_CHECK(parallel.world == 1, "data-parallel training over {} processes needs --device cuda", parallel.world);
    return make_cpu_engine(model, adam);
  }
  check_engine_device(device);
  EngineFactory factory = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    factory = factories().at(device);
  }
  return factory(model, adam, parallel);
}

}  // namespace quiver::train

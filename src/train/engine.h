// Where a training run computes. The trainer (trainer.h) drives an Engine: zero the
// gradients, run the micro-batches, then one optimizer step; it evaluates through the engine
// and, before each checkpoint, asks it to mirror its state into the host model and AdamW,
// which are what checkpoints are written from. So CPU and GPU runs write the same files, and
// either can resume the other's run.
//
// The CPU engine computes in the host model and AdamW themselves. Other devices register a
// factory (the CUDA backend: cuda::register_train_engine(), src/cuda/train_engine.h).
//
// Data parallelism (train/distributed.h): with world > 1 the engine is one of `world`
// processes (ranks) that each run the same steps on their rows of the global micro-batch; the
// engine averages the gradients and the loss over the ranks before the optimizer step, so every
// rank holds the same parameters after it, and each rank keeps its shard of the optimizer state
// (ZeRO-1). Only a device whose factory supports it accepts world > 1 (the CPU engine does not).
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "model/model.h"
#include "train/optimizer.h"

namespace quiver::train {

class Engine {
 public:
  virtual ~Engine() = default;
  // What run.json records as the device: "cpu", or the GPU's name.
  virtual std::string description() const = 0;

  virtual void zero_grads() = 0;
  // Adds grad_scale · dLoss/dθ of one micro-batch (tokens, targets: B·T host ids) into the
  // gradients, and its mean loss into the step's loss sum. `last`: the step's last micro-batch
  // (a data-parallel engine reduces the gradients over the ranks during its backward; earlier
  // micro-batches only accumulate).
  virtual void forward_backward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T,
                                float grad_scale, bool last) = 0;
  struct StepResult {
    double loss_sum = 0;   // the micro-batches' mean losses, summed
    double grad_norm = 0;  // global norm before clipping
  };
  // Clips the global gradient norm to `clip` (0 = off) and applies one AdamW update at lr.
  virtual StepResult optimizer_step(double lr, double clip) = 0;
  // Mean loss of one batch, no gradients.
  virtual double forward_loss(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T) = 0;
  // Copies the parameters into the host model and the full m, v and the step count into the host
  // AdamW. Not between a step's forward_backward and its optimizer_step: a data-parallel engine
  // gathers the shards of m and v through its gradient buffer (and zeroes it after). With
  // several ranks it is a collective: every rank calls it at the same point.
  virtual void sync_to_host() = 0;
  // Whether `flag` is true on any rank (a collective: every rank calls it at the same point);
  // one process: flag itself. Ranks use it to stop at the same step.
  virtual bool any_rank(bool flag) { return flag; }
};

// The process's place in a data-parallel run, and how its gradients travel.
struct Parallel {
  int rank = 0, world = 1;
  std::string rendezvous;  // how rank 0 hands out the communicator id: a file path, or tcp://ADDRESS:PORT
  int64_t bucket_bytes = int64_t{25} << 20;  // gradient bucket cap, in fp32 bytes (train::bucket_plan)
};

std::unique_ptr<Engine> make_cpu_engine(model::Model& model, AdamW& adam);

// A device's engine over the host model and AdamW (their state is uploaded at creation).
using EngineFactory = std::unique_ptr<Engine> (*)(model::Model& model, AdamW& adam, const Parallel& parallel);
void register_engine(const std::string& device, EngineFactory factory);
// Throws, naming the devices this build offers, unless `device` is "cpu" or registered.
void check_engine_device(const std::string& device);
// "cpu", or a registered device; an error names the devices this build offers. world > 1 needs
// a device whose engine is data-parallel.
std::unique_ptr<Engine> make_engine(const std::string& device, model::Model& model, AdamW& adam,
                                    const Parallel& parallel = {});

}  // namespace quiver::train

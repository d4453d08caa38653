// The "cuda" training engine (train::Engine, src/train/engine.h): the GPU model (model.h) with
// fp32 master parameters, AdamW moments and gradients on the device, clipping and AdamW as
// device kernels (ops.h). One step makes one host synchronization, after the optimizer, to
// read the loss and the gradient norm for the metrics.
#pragma once

namespace quiver::train {
class Engine;
}

namespace quiver::cuda {

class OpTimer;

// Registers the engine under the name "cuda" (idempotent).
void register_train_engine();

// The per-op timer of a CUDA engine's model (op_timer.h); null for other engines.
OpTimer* engine_timer(train::Engine& engine);

}  // namespace quiver::cuda

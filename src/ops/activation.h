// Elementwise activations of the feed-forward block.
//
// Shapes: all tensors of one call have the same shape (any), CPU, contiguous, F32 or F64,
// one dtype. Outputs and gradients are assigned.
//
//   SwiGLU: out = silu(gate) · up, silu(g) = g · σ(g)
//   GELU, tanh approximation (as GPT-2 / llm.c / PyTorch approximate="tanh"):
//     y = ½ x (1 + tanh(√(2/π) (x + 0.044715 x³)))
#pragma once

#include "quiver/tensor.h"

namespace quiver::ops {

void swiglu_forward(const Tensor& gate, const Tensor& up, Tensor& out);
// dgate = dout · up · σ(g)(1 + g(1 − σ(g))), dup = dout · silu(gate).
void swiglu_backward(const Tensor& dout, const Tensor& gate, const Tensor& up, Tensor& dgate,
                     Tensor& dup);

void gelu_forward(const Tensor& x, Tensor& y);
void gelu_backward(const Tensor& dy, const Tensor& x, Tensor& dx);

}  // namespace quiver::ops

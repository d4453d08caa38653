// The op-level Relation benchmark on the GPU (issue scales of the Relation paper): FlashRelation
// forward + backward against quiver's own flash attention at the same shapes, each with the
// deterministic two-pass dQ (the default) and the one-pass dQ (flash_dq_atomics, context.h).
// The PyTorch peers (SDPA with the FlashAttention backend, the materialized Relation) come from
// bench/peer_attention.py, which `quiver bench relation --device cuda` runs beside this.
//
// Protocol: bf16 [B, T, H, Dh] inputs (p1, p2 in [-2, 2], Ĩ and dY in [-1, 1]), λ = 0.5 with
// its gradient on, preallocated outputs and workspace. Each trial times `repeat` forward calls,
// then `repeat` backward calls, by CUDA events, for every variant of a shape in turn
// (alternating trials); a variant's forward and backward times are the medians over the trials
// of the per-call means. Every timed variant is then checked on head 0 of batch 0 against the
// CPU flash op in float64 on the same bf16 inputs (ops::flash_relation_forward / backward,
// ops::attention_forward / backward; the backward reference is fed the GPU's own y, as the
// kernels' D_p = dY_p · Y_p is): relative norm error of y and of every gradient, correct when
// each is within 4 bf16 unit roundoffs (2^-6), far below the O(1) of a wrong kernel.
// Needs a GPU; synchronizes the device (it is a benchmark).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace quiver::cuda {

struct RelationBenchShape {
  std::string scale;  // "10M"
  int64_t B = 0, T = 0, H = 0, Dh = 0;
};

// The Relation paper's op-level scales: 65,536, 65,536 and 32,768 tokens per call.
inline std::vector<RelationBenchShape> relation_bench_paper_shapes() {
  return {{"10M", 64, 1024, 8, 48}, {"30M", 32, 2048, 8, 64}, {"100M", 8, 4096, 8, 80}};
}

// The backward modes a run can time, by RelationBenchRow::dq's names: the deterministic two
// passes (the default) and the one-pass dQ (flash_dq_atomics, context.h).
inline std::vector<std::string> relation_bench_dq_modes() { return {"two-pass", "one-pass"}; }

struct RelationBenchOptions {
  std::vector<RelationBenchShape> shapes = relation_bench_paper_shapes();
  std::vector<std::string> dq = {"two-pass", "one-pass"};  // of relation_bench_dq_modes, in any order
  int runs = 11;    // alternating trials (at least 3)
  int repeat = 5;   // calls per trial and pass
  bool check = true;
};

struct RelationBenchRow {
  std::string scale;
  int64_t B = 0, T = 0, H = 0, Dh = 0;
  std::string mixer;  // "flash_relation" or "attention"
  std::string dq;     // "two-pass" (deterministic, the default) or "one-pass"
  double forward_ms = 0, backward_ms = 0, total_ms = 0;
  double tok_s = 0;        // B·T / total
  double rel_error = -1;   // the largest ‖got − ref‖ / ‖ref‖ of the checked head; -1 unchecked
  bool correct = false;    // rel_error within the bound (false when unchecked)
};

std::vector<RelationBenchRow> bench_relation_cuda(const RelationBenchOptions& options = {});

}  // namespace quiver::cuda

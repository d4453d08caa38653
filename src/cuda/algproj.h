// The algebraic projection on the GPU (SPEC §1.3): Y = Φ_W(X), the CUDA counterpart of
// ops::AlgProj (src/ops/algproj.h).
//
// Two schedules compute it; the fused kernels wherever they apply, the products schedule
// elsewhere:
// - fused (algproj_fused.cu): one tensor-core kernel per pass over a tile plan
//   (ops/algproj_tiles.h). A forward tile holds rows of one row type and columns of one output
//   group and accumulates every product that reaches them (both endpoint products of Q_q) in
//   fp32 registers before its single bf16 rounding; a type's rows are addressed through a row
//   list, so strided (cyclic), contiguous (interval) and arbitrary row types run alike. dX is
//   the same kernel with the transposed law; a row-pass reduction far longer than the typical
//   one (Q_q's dX of a type's own group) is split into pieces whose fp32 partial sums a second
//   kernel adds in order. dW gives each dW tile one block that reduces over the rows of the
//   types using that block. Each output element has one owner (a tile or the second kernel),
//   so the results are deterministic. Needs every group offset and width to be even. For a few rows
//   (decoding) the forward also has a matrix-vector kernel on CUDA cores that reads each weight
//   row of the tile's blocks once, in 16-byte vectors (offsets multiples of 8). Where a pair plan
//   exists (ops::plan_pair_pass: graph laws, equal narrow groups, whole tiles of one progression),
//   the forward also has the pair kernel (algproj_pair.cu), whose tiles are fixed TMA boxes.
// - products (diagonal then typed): the law's support cut into rectangles of contiguous
//   (input-group, output-group) ranges exactly as ops::AlgProj does; the terms shared by every
//   row type run once over all rows, then the rest per row type, each rectangle one cuda::gemm
//   (cuBLASLt). A type's rows are used in place when they form an arithmetic progression, else
//   gathered into scratch and scatter-added back; products are summed in an fp32 scratch and
//   rounded to bf16 once.
//
// Tensors whose pointers are not aligned for the fused kernels' copies (2·vec bytes) use the
// products schedule.
//
// Calibration: unless a kernel is pinned (set_kernels), the first call of a pass for a new
// (GPU, law, widths, M, row types) times every fused candidate of that pass (kernel_candidates;
// the products schedule runs only where the fused kernels cannot, or when pinned) on the
// call's own tensors, each after its output has been checked against the products schedule's
// (rejected_candidates), and keeps the fastest in the kernel cache (calibration.h), which
// later calls and later processes read. Calibration synchronizes the stream; during a
// CUDA-graph capture, or with QUIVER_ALGPROJ_CALIBRATE=0, an uncalibrated call uses the
// default choice (fused 64 × 128 tiles, 32- or 16-row tiles when few rows share a type)
// instead. So: run each shape once before capturing a graph.
//
// Precision (shared/DESIGN.md): x, w, dy, y, dx are bf16; dw is fp32; fp32 accumulation; a
// bf16 output is rounded exactly once (as a dense GEMM's would be).
//
// Contract: forward assigns y, or adds to it when accumulate; backward assigns dx and dw
// (either may be null), or adds to dw when accumulate_dw. Shapes: x [M, K], w [K, N], y and dy [M, N], dx [M, K] bf16; dw [K, N]
// fp32; all contiguous CUDA tensors. row_types has M host entries in [0, q).
//
// Streams: every call enqueues on `stream` and, after its first call for a shape, never
// synchronizes the host. The instance keeps device state reused across calls (tile plans per
// row-type vector, products scratch), so one instance's calls must be ordered (one stream, or
// events). A new row-type vector builds and uploads its tile plan (a synchronous copy) on
// first use, which a CUDA-graph capture refuses (an error): run it once first. Plans a
// captured graph uses are kept as long as the instance; others are dropped oldest first
// beyond 32.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "algebra/law.h"
#include "ops/algproj.h"
#include "ops/algproj_tiles.h"
#include "quiver/tensor.h"

namespace quiver::cuda {

// One pass's kernel: the products schedule, the fused tensor-core kernel with configuration
// `config` (an index into the pass's table, algproj_fused_launch.h), or (forward only) the
// few-row kernel with configuration `config` of kAlgGemvConfigs, or the Hopper (TMA and
// wgmma) kernel with configuration `config` of kAlgTmaConfigs, or (forward only) the pair kernel
// with configuration `config` of kAlgPairConfigs.
struct AlgKernel {
  enum class Kind { Products, Fused, Gemv, Tma, Pair };
  Kind kind = Kind::Fused;
  int config = 0;
  // Extra splitting that pays at some shapes and costs at others, so calibration times both: for
  // the dW fused kernel, long row lists split into pieces (ops::plan_weight_pass; slot traffic
  // and a reduction kernel); for the few-row kernel, up to 8 blocks per tile (a cluster that
  // adds its partial sums over distributed shared memory) until about two blocks per
  // multiprocessor run; for the TMA dX (configurations where detail::tma_cluster_splits holds),
  // the long tiles (ops::plan_cluster_split: Q_q's own blocks) by clusters of up to 8 blocks that
  // add their sums over distributed shared memory, before the row pass runs the rest. Other
  // kernels ignore it.
  bool split = false;
  // The TMA weight pass only (dW): the diagonal blocks, which every row type uses, by one strided
  // batched GEMM (ops::plan_diagonal_gemm: equal input groups and equal output groups), the weight
  // pass running the other blocks.
  bool diagonal_gemm = false;
  bool operator==(const AlgKernel&) const = default;
};
std::string kernel_name(ops::AlgPass pass, const AlgKernel& k);  // "products", "fused 64x128"

class AlgProj {
 public:
  using Rect = ops::AlgProj::Rect;
  // Kernels pinned per pass (forward, dX, dW); unset ones are calibrated.
  struct Kernels {
    std::optional<AlgKernel> forward, dx, dw;
  };

  AlgProj(algebra::Law law, algebra::GroupWidths widths,
          ops::RowAccess access = ops::RowAccess::InPlace);

  const algebra::Law& law() const { return law_; }
  const algebra::GroupWidths& widths() const { return widths_; }
  ops::RowAccess access() const { return access_; }
  int64_t K() const { return widths_.K(); }
  int64_t N() const { return widths_.N(); }

  // y = Φ_W(x), assigned, or y += Φ_W(x) when accumulate (one rounding with the fused
  // kernels, two with the products schedule).
  void forward(const Tensor& x, const Tensor& w, const std::vector<int>& row_types, Tensor& y,
               cudaStream_t stream = 0, bool accumulate = false) const;
  // y_a = Φ_{W_a}(x) and y_b = Φ_{W_b}(x), both assigned, for two weight banks of this
  // projection's widths (SwiGLU's gate and up): the same results as two forward calls, in one
  // launch where the forward's kernel for these row types is the few-row one and its plan has no
  // split reductions (decoding).
  void forward_pair(const Tensor& x, const Tensor& w_a, const Tensor& w_b, const std::vector<int>& row_types,
                    Tensor& y_a, Tensor& y_b, cudaStream_t stream = 0) const;
  // act = SwiGLU(x W_gate, x W_up) (assigned, bf16 [M, N]), bit for bit what forward_pair into
  // gate and up and then swiglu_forward give: one launch under the same conditions as
  // forward_pair's, that sequence otherwise. gate and up are scratch [M, N]: what they hold
  // afterwards is unspecified.
  void forward_swiglu(const Tensor& x, const Tensor& w_gate, const Tensor& w_up, const std::vector<int>& row_types,
                      Tensor& gate, Tensor& up, Tensor& act, cudaStream_t stream = 0) const;
  // dx (assigned, bf16) and dw (assigned, or added to when accumulate_dw; fp32) of forward;
  // either may be null.
  void backward(const Tensor& x, const Tensor& w, const Tensor& dy,
                const std::vector<int>& row_types, Tensor* dx, Tensor* dw,
                cudaStream_t stream = 0, bool accumulate_dw = false) const;

  // The kernels calibration times for a pass: the fused configurations (and, forward, the
  // few-row kernels; forward and dX, the TMA kernels unless QUIVER_ALGPROJ_TMA=0), each where it
  // applies. Kernels not yet run on a GPU (the two-group configurations, the dX cluster splits and
  // the dW diagonal GEMMs) join only where QUIVER_ALGPROJ_UNVERIFIED names them (two-group,
  // cluster-split, diagonal-gemm; 1 for all). The products schedule is not among them: it adds
  // several GEMMs into one output element (not one owner), so it runs only where the fused kernels
  // cannot, or pinned.
  static std::vector<AlgKernel> kernel_candidates(ops::AlgPass pass);
  // Calibration checks each candidate's output against the products schedule's on the same
  // inputs before timing it; one that disagrees (outputs_agree, calibration.h) is reported on
  // stderr, listed in the cache entry's "rejected" and never chosen (inputs holding NaN or ∞
  // leave no reference: the entry then says "checked": false). The count of such candidates in
  // this process: nonzero means a kernel is wrong at some shape.
  static int64_t rejected_candidates();
  // Whether the fused kernels apply to these widths (every group offset even).
  bool fused_supported() const { return fused_vec_ > 0; }
  void set_kernels(const Kernels& pinned) { pinned_ = pinned; }
  // The kernel a pass used last (for reports).
  AlgKernel last_kernel(ops::AlgPass pass) const { return last_[static_cast<int>(pass)]; }

  // Products per call (as ops::AlgProj): shared rectangles and those of each type.
  size_t shared_products() const { return shared_.size(); }
  size_t type_products(int alpha) const { return per_type_[alpha].size(); }
  const std::vector<Rect>& shared_rects() const { return shared_; }
  const std::vector<Rect>& type_rects(int alpha) const { return per_type_[alpha]; }

 private:
  // Device scratch reused across calls; grown (never shrunk) on demand.
  struct Scratch {
    Tensor acc;      // fp32 [M, N] or [M, K] accumulator of a bf16 output
    Tensor part;     // fp32 [m, N] or [m, K] product of one gathered type
    Tensor rows_a;   // bf16 gathered rows of x or dy
    Tensor rows_b;   // bf16 gathered rows of dy (dW)
    Tensor indices;  // int64 row indices of every gathered type, concatenated
    Tensor sum;      // bf16 [M, N]: the products of an accumulating forward
  };

  algebra::Law law_;
  algebra::GroupWidths widths_;
  ops::RowAccess access_;
  std::vector<int64_t> k_off_, n_off_;
  std::vector<Rect> shared_;
  std::vector<std::vector<Rect>> per_type_;
  bool shared_cover_all_ = false;  // the shared rectangles tile the whole K×N grid
  mutable Scratch scratch_;

  // A tile plan on the device, for one pass, tile shape and row-type vector.
  struct DevicePlan {
    ops::AlgPass pass;
    AlgKernel kernel;
    std::vector<int> types;
    Tensor buffer;  // rows, tiles, segments, splits
    const int32_t* rows = nullptr;
    const void* tiles = nullptr;
    const ops::AlgSegment* segments = nullptr;
    const ops::AlgSegmentPlace* places = nullptr;  // a packed plan's (packed configurations); else null
    int num_tiles = 0;
    const void* splits = nullptr;  // split reductions (ops::AlgSplit or AlgWeightSplit) and their fp32 slots
    int num_splits = 0, slot_rows = 0, slot_cols = 0;
    Tensor partials;
    int slices = 1;  // the few-row kernel's blocks per tile (AlgRowArgs::slices)
    // The TMA row pass's row stride (AlgTmaArgs::row_stride), or the TMA weight pass's chunk
    // stride (AlgTmaWeightArgs::stride); 0: it cannot run the plan.
    int tma_stride = 0;
    // A TMA row configuration with extra slices (AlgTmaConfig::extra) whose walk of the plan's
    // segments takes no fewer stages than without them: its twin without them is as fast.
    bool tma_extra_idle = false;
    // A two-group configuration's plan (ops::plan_two_group_pass), or a diagonal-GEMM one's
    // (ops::plan_diagonal_gemm): why there is none; empty else.
    std::string why_not;
    // A TMA dX split configuration's cluster plan (ops::plan_cluster_split): its long tiles, which
    // launch_algproj_tma_cluster runs with cluster_parts blocks each before the row pass runs the
    // other num_tiles; none: nothing to split.
    const ops::AlgRowTile* cluster_tiles = nullptr;
    int num_cluster_tiles = 0, cluster_parts = 0, cluster_cols = 0;
    // A TMA weight diagonal-GEMM configuration's diagonal blocks (ops::plan_diagonal_gemm), which
    // one batched GEMM computes after the weight pass runs the other tiles; in 0: none (why_not).
    int64_t diagonal_in = 0, diagonal_out = 0;
    // A staged row configuration's tiles as one TMA store box each (AlgRowArgs::y_rows); rows 0:
    // they are copied out by the block's threads.
    ops::AlgStoreBox store_box;
    // The pair kernel's plan (ops::AlgPairPlan without its tiles); stride 0: it cannot run it.
    struct PairShape {
      int stride = 0, in = 0, slot = 0, tile_cols = 0, group_cols = 0;
      int segments = 0;  // ops::AlgPairPlan::segments less its end (the list is at DevicePlan::rows)
    } pair;
    const void* chunks = nullptr;  // the TMA weight pass's ops::AlgWeightChunk and tile_begin
    const int32_t* tile_begin = nullptr;
    bool captured = false;  // used in a CUDA-graph capture: kept while the instance lives
  };
  const DevicePlan& plan(ops::AlgPass pass, const AlgKernel& kernel, const std::vector<int>& types,
                         cudaStream_t stream) const;
  // fused_ok: tensors aligned for the fused kernels' copies; tma_ok: also for the TMA row pass's
  // tensor maps (the input and W 16-byte aligned, K and N multiples of 8).
  // run(k) computes the pass by kernel k into the tensor output() returns (assigned, not added),
  // which calibration checks against the products schedule's before timing k.
  AlgKernel choose(ops::AlgPass pass, const std::vector<int>& types, bool fused_ok, bool tma_ok,
                   cudaStream_t stream, const std::function<void(const AlgKernel&)>& run,
                   const std::function<const Tensor&()>& output) const;
  bool tma_ok(const void* input, const void* w) const {
    return K() % 8 == 0 && N() % 8 == 0 && reinterpret_cast<uintptr_t>(input) % 16 == 0 &&
           reinterpret_cast<uintptr_t>(w) % 16 == 0;
  }
  // `w2`, `out2` (the few-row forward without split reductions only): a second weight bank and
  // output in the same launch, or with `swiglu` (no out2) SwiGLU of both products into out
  // (AlgRowArgs::w2, swiglu).
  void run_fused(ops::AlgPass pass, const AlgKernel& kernel, const Tensor& a, const Tensor& w, const Tensor* x,
                 const std::vector<int>& types, Tensor& out, bool accumulate, cudaStream_t stream,
                 const Tensor* w2 = nullptr, Tensor* out2 = nullptr, bool swiglu = false) const;
  // Whether the forward kernel k over these row types can take a second weight bank in its
  // launch (forward_pair, forward_swiglu), given the alignment of the extra tensors.
  bool pairs_in_one_launch(const AlgKernel& k, const std::vector<int>& row_types, bool extra_aligned,
                           cudaStream_t stream) const;
  // The forward's kernel for these row types, calibrated on y's first use of them (forward).
  AlgKernel forward_choice(const Tensor& x, const Tensor& w, const std::vector<int>& row_types, Tensor& y,
                           bool accumulate, cudaStream_t stream) const;
  void forward_run(const AlgKernel& k, const Tensor& x, const Tensor& w, const std::vector<int>& row_types,
                   Tensor& y, bool accumulate, cudaStream_t stream) const;
  int fused_vec_ = 0;  // copy granularity of the fused kernels (8, 2), 0 when unsupported
  Kernels pinned_;
  mutable std::vector<DevicePlan> plans_;  // most recent last
  struct Choice {
    ops::AlgPass pass;
    std::vector<int> types;
    AlgKernel kernel;
  };
  mutable std::vector<Choice> choices_;
  mutable AlgKernel last_[3];
};

}  // namespace quiver::cuda

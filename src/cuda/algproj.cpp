// The GPU algebraic projection (algproj.h): host-side checks, and the schedule of cuda::gemm
// products, gathers and scatter-adds over the support plan it shares with the CPU path
// (ops::plan_support, ops::rows_by_type).
#include "cuda/algproj.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "cuda/algproj_fused_launch.h"
#include "cuda/algproj_launch.h"
#include "cuda/calibration.h"
#include "cuda/check.h"
#include "cuda/elementwise_launch.h"
#include "cuda/gemm.h"
#include "cuda/model_launch.h"
#include "cuda/tma.h"
#include "quiver/error.h"

namespace quiver::cuda {

using algebra::GroupWidths;
using algebra::Law;

namespace {

using Rect = AlgProj::Rect;
// The rows of one type (ops::rows_by_type) and, when gathered, where their indices sit in
// the uploaded index buffer.
struct RowSet : ops::TypeRows {
  int64_t index_offset = 0;
};

std::vector<RowSet> group_rows(const std::vector<int>& row_types, int q, ops::RowAccess access) {
  std::vector<RowSet> sets;
  for (ops::TypeRows& t : ops::rows_by_type(row_types, q, access)) sets.push_back({std::move(t), 0});
  return sets;
}

void check_tensor(const Tensor& t, const Shape& shape, DType dtype, const char* name) {
  QV_CHECK(t.defined(), "algproj: {} is undefined", name);
  QV_CHECK(t.device() == Device::CUDA && t.is_contiguous(),
           "algproj: {} must be a contiguous CUDA tensor (shape {}, device {})", name,
           shape_str(t.shape()), quiver::device_name(t.device()));
  QV_CHECK(t.dtype() == dtype, "algproj: {}: expected dtype {}, got {}", name, dtype_name(dtype),
           dtype_name(t.dtype()));
  QV_CHECK(t.shape() == shape, "algproj: {}: expected shape {}, got {}", name, shape_str(shape),
           shape_str(t.shape()));
}

void check_inputs(const Tensor& x, const Tensor& w, int64_t K, int64_t N, size_t types) {
  QV_CHECK(x.defined() && x.ndim() == 2, "algproj: x must be [M, K], got {}",
           x.defined() ? shape_str(x.shape()) : std::string("undefined"));
  check_tensor(x, {x.dim(0), K}, DType::BF16, "x");
  check_tensor(w, {K, N}, DType::BF16, "w");
  QV_CHECK(static_cast<int64_t>(types) == x.dim(0), "algproj: row_types: {} entries for {} rows",
           types, x.dim(0));
}

// A device buffer of at least `bytes`, reallocated (cudaFree synchronizes, so an old buffer
// still read by queued work is never freed under it) only when too small.
void* ensure(Tensor& buf, size_t bytes) {
  if (!buf.defined() || buf.nbytes() < bytes) {
    const int64_t words = static_cast<int64_t>((bytes + 7) / 8);
    buf = Tensor::empty({std::max<int64_t>(words, 1)}, DType::F64, Device::CUDA);
  }
  return buf.raw();
}

// Zeroes columns [c0, c1) of a rows × ld matrix (elements of es bytes; 0 bits are 0 in bf16
// and fp32).
void zero_columns(void* base, size_t es, int64_t rows, int64_t ld, int64_t c0, int64_t c1,
                  cudaStream_t stream) {
  if (rows == 0 || c1 <= c0) return;
  QV_CUDA_CHECK(cudaMemset2DAsync(static_cast<char*>(base) + c0 * es, ld * es, 0, (c1 - c0) * es,
                                  rows, stream));
}

// One projection pass, forward (out groups δ, in = x) or dX (out groups β, in = dy):
// out[rows, :] = Σ over rectangles of in[rows, in groups] · (block of W or Wᵀ).
struct Pass {
  bool out_is_delta;
  const uint16_t* in;  // [M, in_cols] bf16
  int64_t in_cols, out_cols;
  const uint16_t* w;  // [K, N] bf16
  const std::vector<int64_t>* ko;
  const std::vector<int64_t>* no;
  int64_t N;

  int g0(const Rect& r) const { return out_is_delta ? r.d0 : r.b0; }
  int g1(const Rect& r) const { return out_is_delta ? r.d1 : r.b1; }
  const std::vector<int64_t>& out_off() const { return out_is_delta ? *no : *ko; }

  // C[rows, out cols of r] (+)= A[rows, in cols of r] · block(r); A and C point at row 0.
  void product(const Rect& r, int64_t rows, const uint16_t* A, int64_t lda, void* C,
               DType c_type, int64_t ldc, float beta, cudaStream_t stream) const {
    const int64_t k0 = (*ko)[r.b0], kw = (*ko)[r.b1] - k0;
    const int64_t n0 = (*no)[r.d0], nw = (*no)[r.d1] - n0;
    const size_t es = dtype_size(c_type);
    const uint16_t* block = w + k0 * N + n0;
    if (out_is_delta)  // y[:, δ] += x[:, β] W_βδ
      gemm(false, false, rows, nw, kw, 1.0f, A + k0, DType::BF16, lda, block, DType::BF16, N,
           beta, static_cast<char*>(C) + n0 * es, c_type, ldc, stream);
    else  // dx[:, β] += dy[:, δ] W_βδᵀ
      gemm(false, true, rows, kw, nw, 1.0f, A + n0, DType::BF16, lda, block, DType::BF16, N,
           beta, static_cast<char*>(C) + k0 * es, c_type, ldc, stream);
  }

  // Runs rects over `rows` rows into C (row stride ldc): the first product to reach an
  // output group assigns it (beta 0), later ones accumulate; groups no rectangle reaches
  // are zeroed. Afterwards every element of C's rows is defined.
  void assign(const std::vector<Rect>& rects, int q, int64_t rows, const uint16_t* A,
              int64_t lda, void* C, DType c_type, int64_t ldc, cudaStream_t stream) const {
    const std::vector<int64_t>& off = out_off();
    const size_t es = dtype_size(c_type);
    std::vector<char> written(q, 0);
    for (const Rect& r : rects) {
      int fresh = 0;
      for (int g = g0(r); g < g1(r); ++g) fresh += !written[g];
      const bool first = fresh == g1(r) - g0(r);
      if (!first && fresh > 0)
        for (int g = g0(r); g < g1(r); ++g)
          if (!written[g]) zero_columns(C, es, rows, ldc, off[g], off[g + 1], stream);
      product(r, rows, A, lda, C, c_type, ldc, first ? 0.0f : 1.0f, stream);
      for (int g = g0(r); g < g1(r); ++g) written[g] = 1;
    }
    for (int g = 0; g < q; ++g)
      if (!written[g]) zero_columns(C, es, rows, ldc, off[g], off[g + 1], stream);
  }
};

// Concatenates the row indices of the gathered types, records their offsets and uploads them.
// Returns the device array (null when nothing is gathered).
const int64_t* upload_gathered(std::vector<RowSet>& sets,
                               const std::vector<std::vector<Rect>>& per_type, Tensor& buf,
                               cudaStream_t stream) {
  std::vector<int64_t> all;
  for (size_t a = 0; a < sets.size(); ++a) {
    RowSet& s = sets[a];
    if (s.rows.empty() || per_type[a].empty() || s.progression) continue;
    s.index_offset = static_cast<int64_t>(all.size());
    all.insert(all.end(), s.rows.begin(), s.rows.end());
  }
  if (all.empty()) return nullptr;
  void* dev = ensure(buf, all.size() * sizeof(int64_t));
  // Pageable source: the copy is staged before this returns, so `all` may die afterwards.
  QV_CUDA_CHECK(cudaMemcpyAsync(dev, all.data(), all.size() * sizeof(int64_t),
                                cudaMemcpyHostToDevice, stream));
  return static_cast<const int64_t*>(dev);
}

bool any_type_products(const std::vector<RowSet>& sets,
                       const std::vector<std::vector<Rect>>& per_type) {
  for (size_t a = 0; a < sets.size(); ++a)
    if (!sets[a].rows.empty() && !per_type[a].empty()) return true;
  return false;
}

}  // namespace

AlgProj::AlgProj(Law law, GroupWidths widths, ops::RowAccess access)
    : law_(std::move(law)), widths_(std::move(widths)), access_(access) {
  widths_.validate(law_.q());
  k_off_ = widths_.in_offsets();
  n_off_ = widths_.out_offsets();
  ops::SupportPlan plan = ops::plan_support(law_);
  shared_cover_all_ = plan.shared_covers_all;
  shared_ = std::move(plan.shared);
  per_type_ = std::move(plan.per_type);
  // The fused kernels copy `vec` elements at a time: every offset (hence every width and the
  // leading dimensions K and N) must be a multiple of it.
  for (int vec : {8, 4, 2}) {
    bool ok = true;
    for (int64_t o : k_off_) ok = ok && o % vec == 0;
    for (int64_t o : n_off_) ok = ok && o % vec == 0;
    if (ok) {
      fused_vec_ = vec;
      break;
    }
  }
}

namespace {

// The whole pass into a bf16 output out [M, out_cols] (assigned).
void run_pass(const Pass& p, int q, int64_t M, const std::vector<Rect>& shared,
              const std::vector<std::vector<Rect>>& per_type, std::vector<RowSet>& sets,
              uint16_t* out, Tensor& acc_buf, Tensor& part_buf, Tensor& rows_buf,
              Tensor& index_buf, cudaStream_t stream) {
  const int64_t oc = p.out_cols, ic = p.in_cols;
  // Direct: no per-type product runs and no output group is reached twice, so each output
  // element is one product, rounded to bf16 once by the GEMM itself.
  bool direct = !any_type_products(sets, per_type);
  if (direct) {
    std::vector<int> reach(q, 0);
    for (const Rect& r : shared)
      for (int g = p.g0(r); g < p.g1(r); ++g) direct = direct && ++reach[g] == 1;
  }
  if (direct) {
    p.assign(shared, q, M, p.in, ic, out, DType::BF16, oc, stream);
    return;
  }
  // Otherwise sum every product in fp32 and round once at the end.
  auto* acc = static_cast<float*>(ensure(acc_buf, M * oc * sizeof(float)));
  p.assign(shared, q, M, p.in, ic, acc, DType::F32, oc, stream);
  const int64_t* indices = upload_gathered(sets, per_type, index_buf, stream);
  for (int a = 0; a < q; ++a) {
    const RowSet& s = sets[a];
    const int64_t m = static_cast<int64_t>(s.rows.size());
    if (m == 0 || per_type[a].empty()) continue;
    if (s.progression) {
      const int64_t r0 = s.rows[0];
      for (const Rect& r : per_type[a])
        p.product(r, m, p.in + r0 * ic, s.stride * ic, acc + r0 * oc, DType::F32, s.stride * oc,
                  1.0f, stream);
    } else {
      const int64_t* idx = indices + s.index_offset;
      auto* rows = static_cast<uint16_t*>(ensure(rows_buf, m * ic * sizeof(uint16_t)));
      auto* part = static_cast<float*>(ensure(part_buf, m * oc * sizeof(float)));
      detail::launch_gather_rows_bf16(p.in, ic, idx, m, rows, stream);
      p.assign(per_type[a], q, m, rows, ic, part, DType::F32, oc, stream);
      detail::launch_scatter_add_rows_f32(part, oc, idx, m, acc, stream);
    }
  }
  detail::launch_f32_to_bf16(acc, out, M * oc, stream);
}

// dW_βδ = Σ_rows X[:, β]ᵀ dY[:, δ] over the rectangles, in fp32 directly. The shared
// rectangles are disjoint: when they tile the whole grid (and rows exist) and dw is assigned,
// each assigns its block; otherwise dw is cleared first (unless accumulating) and every
// product accumulates (per-type blocks may overlap each other).
struct DwProducts {
  float* DW;  // [K, N]
  int64_t N;
  const std::vector<int64_t>& k_off;
  const std::vector<int64_t>& n_off;

  void product(const Rect& r, int64_t m, const uint16_t* Xa, int64_t ldx, const uint16_t* DYa, int64_t ldy,
               float beta, cudaStream_t stream) const {
    const int64_t k0 = k_off[r.b0], kw = k_off[r.b1] - k0;
    const int64_t n0 = n_off[r.d0], nw = n_off[r.d1] - n0;
    gemm(true, false, kw, nw, m, 1.0f, Xa + k0, DType::BF16, ldx, DYa + n0, DType::BF16, ldy, beta,
         DW + k0 * N + n0, DType::F32, N, stream);
  }
};

std::string widths_key(const std::vector<int64_t>& w) {
  std::string s;
  for (size_t i = 0; i < w.size(); ++i) s += (i ? "," : "") + std::to_string(w[i]);
  return s;
}

uint64_t types_hash(const std::vector<int>& types) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (int t : types) {
    h ^= static_cast<uint32_t>(t);
    h *= 1099511628211ull;
  }
  return h;
}

const char* pass_name(ops::AlgPass pass) {
  switch (pass) {
    case ops::AlgPass::Forward: return "forward";
    case ops::AlgPass::DX: return "dx";
    case ops::AlgPass::DW: return "dw";
  }
  return "?";
}

const detail::AlgKernelConfig& kernel_config(ops::AlgPass pass, int config) {
  return pass == ops::AlgPass::DW ? detail::kAlgWeightConfigs[config] : detail::kAlgRowConfigs[config];
}

bool aligned(const void* p, int vec) { return reinterpret_cast<uintptr_t>(p) % (2 * vec) == 0; }

// The TMA row pass is a calibration candidate (and a cached choice of it used) unless
// QUIVER_ALGPROJ_TMA=0; pinned, it always runs.
bool tma_candidates() {
  static const bool on = [] {
    const char* env = std::getenv("QUIVER_ALGPROJ_TMA");
    return env == nullptr || std::string(env) != "0";
  }();
  return on;
}

// Kernels built but not yet run on a GPU, by name: calibration candidates only where
// QUIVER_ALGPROJ_UNVERIFIED names them (a comma-separated list, or "1" for all) until their GPU
// tests have passed, since a TMA kernel that faults ends the process, which calibration's output
// check cannot catch; pinned, they always run. Now the two-group configurations
// (AlgTmaConfig::two_groups; GpuAlgProj.TmaTwoGroupForward), the dX cluster splits
// (GpuAlgProj.TmaClusterSplitDx) and the dW diagonal GEMMs (GpuAlgProj.TmaWeightDiagonalGemm).
constexpr const char* kUnverified[] = {"two-group", "cluster-split", "diagonal-gemm"};
const char* unverified(ops::AlgPass pass, const AlgKernel& k) {
  if (k.kind != AlgKernel::Kind::Tma) return nullptr;
  if (pass == ops::AlgPass::DW) return k.diagonal_gemm ? kUnverified[2] : nullptr;
  return detail::kAlgTmaConfigs[k.config].two_groups ? kUnverified[0] : k.split ? kUnverified[1] : nullptr;
}
bool unverified_allowed(const std::string& name) {
  static const std::vector<std::string> allowed = [] {
    const char* env = std::getenv("QUIVER_ALGPROJ_UNVERIFIED");
    const std::string list = env ? env : "";
    if (list == "1") return std::vector<std::string>(std::begin(kUnverified), std::end(kUnverified));
    std::vector<std::string> names;
    for (size_t at = 0; at < list.size();) {
      const size_t end = std::min(list.find(',', at), list.size());
      names.push_back(list.substr(at, end - at));
      QV_CHECK(std::find(std::begin(kUnverified), std::end(kUnverified), names.back()) != std::end(kUnverified),
               "QUIVER_ALGPROJ_UNVERIFIED: '{}' is no kernel name ({}, or 1 for all)", names.back(),
               fmt::join(kUnverified, ", "));
      at = end + 1;
    }
    return names;
  }();
  return std::find(allowed.begin(), allowed.end(), name) != allowed.end();
}
bool tma_candidate(ops::AlgPass pass, const AlgKernel& k) {
  const char* name = unverified(pass, k);
  return tma_candidates() && (name == nullptr || unverified_allowed(name));
}

}  // namespace

std::string kernel_name(ops::AlgPass pass, const AlgKernel& k) {
  if (k.kind == AlgKernel::Kind::Products) return "products";
  if (k.kind == AlgKernel::Kind::Gemv)
    return fmt::format("gemv {}x{}{}", detail::kAlgGemvConfigs[k.config].rows, detail::kAlgGemvConfigs[k.config].cols,
                       k.split ? " split" : "");
  if (k.kind == AlgKernel::Kind::Tma) {
    const bool dw = pass == ops::AlgPass::DW;
    const detail::AlgTmaConfig& c = dw ? detail::kAlgTmaWeightConfigs[k.config] : detail::kAlgTmaConfigs[k.config];
    return fmt::format("tma {}x{} k{}{}x{}{}{}{}{}{}{}{}{}{}{}", c.tile_rows(), c.tile_cols(), detail::kAlgTmaChunk,
                       c.extra > 0 ? fmt::format("+{}", 16 * c.extra) : "", c.stages,
                       c.groups > 1 ? fmt::format(" {}wg", c.groups) : "", c.cooperative ? " cooperative" : "",
                       c.tall ? " tall" : "", c.persistent ? " persistent" : "", c.eager ? " eager" : "",
                       c.one_staging ? " one-staging" : "", c.ring_staging ? " ring-staging" : "",
                       c.two_groups ? " two-group" : "", k.split ? " split" : "",
                       dw && k.diagonal_gemm ? " diagonal-gemm" : "");
  }
  if (k.kind == AlgKernel::Kind::Pair) {
    const detail::AlgPairConfig& c = detail::kAlgPairConfigs[k.config];
    return fmt::format("pair {}x{}g{} x{}{}{}", c.rows, c.groups, c.group_box, c.stages,
                       c.lane_producer ? " lane-producer" : "", c.merged_own ? " merged" : "");
  }
  const detail::AlgKernelConfig& c = kernel_config(pass, k.config);
  return fmt::format("fused {}x{} k{}x{}{}{}{}", c.rows, c.cols, c.chunk, c.stages, c.packed ? " packed" : "",
                     c.staged ? " staged" : "", k.split ? " split" : "");
}

std::vector<AlgKernel> AlgProj::kernel_candidates(ops::AlgPass pass) {
  std::vector<AlgKernel> out;
  const int n = pass == ops::AlgPass::DW ? detail::kAlgWeightConfigCount : detail::kAlgRowConfigCount;
  for (int c = 0; c < n; ++c) {
    if (pass == ops::AlgPass::DX && detail::kAlgRowConfigs[c].packed) continue;  // packed plans: forward only
    out.push_back({AlgKernel::Kind::Fused, c});
    if (pass == ops::AlgPass::DW) out.push_back({AlgKernel::Kind::Fused, c, true});
  }
  if (pass == ops::AlgPass::Forward) {
    for (int c = 0; c < detail::kAlgGemvConfigCount; ++c) {
      out.push_back({AlgKernel::Kind::Gemv, c});
      out.push_back({AlgKernel::Kind::Gemv, c, true});
    }
    for (int c = 0; c < detail::kAlgPairConfigCount; ++c) out.push_back({AlgKernel::Kind::Pair, c});
  }
  if (pass != ops::AlgPass::DW)
    for (int c = 0; c < detail::kAlgTmaConfigCount; ++c) {
      out.push_back({AlgKernel::Kind::Tma, c});
      if (pass == ops::AlgPass::DX && detail::tma_cluster_splits(detail::kAlgTmaConfigs[c]))
        out.push_back({AlgKernel::Kind::Tma, c, true});
    }
  else
    for (int c = 0; c < detail::kAlgTmaWeightConfigCount; ++c) {
      out.push_back({AlgKernel::Kind::Tma, c});
      out.push_back({AlgKernel::Kind::Tma, c, true});
      out.push_back({AlgKernel::Kind::Tma, c, false, true});
    }
  return out;
}

const AlgProj::DevicePlan& AlgProj::plan(ops::AlgPass pass, const AlgKernel& kernel, const std::vector<int>& types,
                                          cudaStream_t stream) const {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  QV_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  for (size_t i = 0; i < plans_.size(); ++i)
    if (plans_[i].pass == pass && plans_[i].kernel == kernel && plans_[i].types == types) {
      plans_[i].captured = plans_[i].captured || capture != cudaStreamCaptureStatusNone;
      return plans_[i];
    }
  QV_CHECK(capture == cudaStreamCaptureStatusNone,
           "algproj: a {} call with new row types during a CUDA-graph capture; run it once before capturing",
           pass_name(pass));
  // Bounded: the oldest plan no captured graph refers to goes (cudaFree waits for queued work).
  constexpr size_t kMaxPlans = 32;
  if (plans_.size() >= kMaxPlans) {
    auto old = std::find_if(plans_.begin(), plans_.end(), [](const DevicePlan& d) { return !d.captured; });
    if (old != plans_.end()) plans_.erase(old);
  }
  int tile_rows, tile_cols;
  if (kernel.kind == AlgKernel::Kind::Gemv) {
    tile_rows = detail::kAlgGemvConfigs[kernel.config].rows;
    tile_cols = detail::kAlgGemvConfigs[kernel.config].cols;
  } else if (kernel.kind == AlgKernel::Kind::Tma) {
    const detail::AlgTmaConfig& c =
        (pass == ops::AlgPass::DW ? detail::kAlgTmaWeightConfigs : detail::kAlgTmaConfigs)[kernel.config];
    tile_rows = c.tile_rows();
    tile_cols = c.tile_cols();
  } else if (kernel.kind == AlgKernel::Kind::Pair) {
    QV_CHECK(pass == ops::AlgPass::Forward, "algproj: the pair kernel runs the forward only");
    tile_rows = detail::kAlgPairConfigs[kernel.config].rows;
    tile_cols = detail::kAlgPairConfigs[kernel.config].group_box;
  } else {
    tile_rows = kernel_config(pass, kernel.config).rows;
    tile_cols = kernel_config(pass, kernel.config).cols;
  }
  DevicePlan d;
  d.pass = pass;
  d.kernel = kernel;
  d.types = types;
  std::vector<char> bytes;
  auto append = [&](const void* src, size_t n) {
    const size_t at = (bytes.size() + 15) / 16 * 16;
    bytes.resize(at + n);
    if (n) std::memcpy(bytes.data() + at, src, n);
    return at;
  };
  size_t rows_at, tiles_at, segs_at = 0, places_at = 0, splits_at = 0, chunks_at = 0, tile_begin_at = 0, cluster_at = 0;
  bool packed = false;
  int dev = 0, sms = 0;
  QV_CUDA_CHECK(cudaGetDevice(&dev));
  QV_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  if (kernel.kind == AlgKernel::Kind::Pair) {
    const detail::AlgPairConfig& c = detail::kAlgPairConfigs[kernel.config];
    const ops::AlgPairPlan p = ops::plan_pair_pass(law_, widths_, types, c.rows, c.groups, c.group_box);
    if (!p.tiles.empty() && detail::alg_pair_runs(c, p.slot, p.tile_cols, p.own_gap))
      d.pair = {p.stride, p.in, p.slot, p.tile_cols, p.group_cols, static_cast<int>(p.segments.size()) - 1};
    tiles_at = append(p.tiles.data(), p.tiles.size() * sizeof(ops::AlgPairTile));
    rows_at = append(p.segments.data(), p.segments.size() * sizeof(int32_t));  // a pair tile names its rows
    d.num_tiles = static_cast<int>(p.tiles.size());
  } else if (pass == ops::AlgPass::DW) {
    // The split candidate: long lists, and every list where there are fewer than four tiles
    // per multiprocessor (about two waves of two resident blocks).
    ops::AlgWeightPlan p =
        ops::plan_weight_pass(law_, widths_, types, tile_rows, tile_cols, kernel.split, 4 * int64_t{sms});
    if (kernel.kind == AlgKernel::Kind::Tma && kernel.diagonal_gemm) {  // the diagonal blocks by one GEMM
      const ops::AlgDiagonalGemm diag = ops::plan_diagonal_gemm(law_, widths_);
      d.why_not = diag.why_not;
      if (diag.in > 0 && p.splits.empty()) {
        ops::drop_diagonal_tiles(p, widths_);
        d.diagonal_in = diag.in;
        d.diagonal_out = diag.out;
      } else if (diag.in > 0) {
        d.why_not = "the plan has split row lists";
      }
    }
    rows_at = append(p.rows.data(), p.rows.size() * sizeof(int32_t));
    tiles_at = append(p.tiles.data(), p.tiles.size() * sizeof(ops::AlgWeightTile));
    splits_at = append(p.splits.data(), p.splits.size() * sizeof(ops::AlgWeightSplit));
    if (kernel.kind == AlgKernel::Kind::Tma) {  // the TMA weight pass reads the rows in chunks
      const ops::AlgWeightChunks c = ops::plan_weight_chunks(p, types, law_.q());
      d.tma_stride = c.stride;
      chunks_at = append(c.chunks.data(), c.chunks.size() * sizeof(ops::AlgWeightChunk));
      tile_begin_at = append(c.tile_begin.data(), c.tile_begin.size() * sizeof(int32_t));
    }
    d.num_tiles = static_cast<int>(p.tiles.size());
    d.num_splits = static_cast<int>(p.splits.size());
    d.slot_rows = p.slot_rows;
    d.slot_cols = p.slot_cols;
    if (p.num_slots > 0)
      d.partials = Tensor::empty({static_cast<int64_t>(p.num_slots) * p.slot_rows * p.slot_cols}, DType::F32,
                                 Device::CUDA);
  } else {
    // The TMA row pass has no reduction pass: its plans are not split (docs/decisions.md).
    // Packed configurations run packed plans, never split (ops/algproj_tiles.h).
    packed = kernel.kind == AlgKernel::Kind::Fused && detail::kAlgRowConfigs[kernel.config].packed;
    // Two-group configurations run two-group plans (forward only; none for dX).
    const bool two_groups = kernel.kind == AlgKernel::Kind::Tma && detail::kAlgTmaConfigs[kernel.config].two_groups;
    ops::AlgTwoGroupPlan two;
    if (two_groups && pass == ops::AlgPass::Forward)
      two = ops::plan_two_group_pass(law_, widths_, types, tile_rows, detail::kAlgTmaConfigs[kernel.config].cols,
                                     detail::kAlgTmaChunk);
    else if (two_groups)
      two.why_not = "this is the dX pass";
    d.why_not = two.why_not;
    ops::AlgRowPlan p = two_groups ? std::move(two.plan)
                                   : ops::plan_row_pass(law_, widths_, types, pass, tile_rows, tile_cols,
                                                        kernel.kind != AlgKernel::Kind::Tma && !packed,
                                                        packed ? detail::kAlgRowConfigs[kernel.config].chunk : 0);
    std::vector<ops::AlgRowTile> cluster_tiles;
    if (kernel.kind == AlgKernel::Kind::Tma) {
      // Of the whole plan: a cluster plan's split tiles are some of its tiles.
      d.tma_stride = p.tiles.empty() ? 0 : ops::uniform_row_stride(p, static_cast<int64_t>(types.size()));
      if (kernel.split && pass == ops::AlgPass::DX && detail::tma_cluster_splits(detail::kAlgTmaConfigs[kernel.config])) {
        ops::AlgClusterPlan cp = ops::plan_cluster_split(std::move(p), detail::kAlgTmaChunk, detail::kAlgTmaRows,
                                                         detail::kAlgTmaClusterMaxCols, detail::kAlgTmaClusterMaxParts);
        p = std::move(cp.plan);
        cluster_tiles = std::move(cp.split);
        d.cluster_parts = cp.parts;
        d.cluster_cols = cp.cols;
      }
      const int extra = detail::kAlgTmaConfigs[kernel.config].extra;
      d.tma_extra_idle = extra > 0 && std::all_of(p.segments.begin(), p.segments.end(), [&](const ops::AlgSegment& s) {
                           return detail::tma_chunks(s.len, extra) == detail::tma_chunks(s.len, 0);
                         });
    }
    if (kernel.kind == AlgKernel::Kind::Fused && detail::kAlgRowConfigs[kernel.config].staged)
      d.store_box = ops::uniform_store_box(p, static_cast<int64_t>(types.size()));
    rows_at = append(p.rows.data(), p.rows.size() * sizeof(int32_t));
    tiles_at = append(p.tiles.data(), p.tiles.size() * sizeof(ops::AlgRowTile));
    segs_at = append(p.segments.data(), p.segments.size() * sizeof(ops::AlgSegment));
    places_at = append(p.places.data(), p.places.size() * sizeof(ops::AlgSegmentPlace));
    splits_at = append(p.splits.data(), p.splits.size() * sizeof(ops::AlgSplit));
    cluster_at = append(cluster_tiles.data(), cluster_tiles.size() * sizeof(ops::AlgRowTile));
    d.num_cluster_tiles = static_cast<int>(cluster_tiles.size());
    d.num_tiles = static_cast<int>(p.tiles.size());
    d.num_splits = static_cast<int>(p.splits.size());
    d.slot_rows = p.slot_rows;
    d.slot_cols = p.slot_cols;
    if (p.num_slots > 0)
      d.partials = Tensor::empty({static_cast<int64_t>(p.num_slots) * p.slot_rows * p.slot_cols}, DType::F32,
                                 Device::CUDA);
    // The split few-row kernel: clusters of up to 8 blocks per tile, until about two blocks
    // per multiprocessor run.
    if (kernel.kind == AlgKernel::Kind::Gemv && kernel.split) {
      while (d.slices < 8 && static_cast<int64_t>(d.num_tiles) * d.slices < 2 * static_cast<int64_t>(sms))
        d.slices *= 2;
    }
  }
  d.buffer = Tensor::empty({std::max<int64_t>(static_cast<int64_t>(bytes.size() + 7) / 8, 1)}, DType::F64,
                           Device::CUDA);
  char* base = static_cast<char*>(d.buffer.raw());
  // Uploaded once per plan (the first call of a shape), ordered on the stream that runs it: a
  // pageable cudaMemcpy may return before its DMA lands, and the legacy stream it runs on does
  // not order a non-blocking stream's kernels (the model's). The pageable source is staged
  // before the call returns.
  QV_CUDA_CHECK(cudaMemcpyAsync(base, bytes.data(), bytes.size(), cudaMemcpyHostToDevice, stream));
  d.rows = reinterpret_cast<const int32_t*>(base + rows_at);
  d.tiles = base + tiles_at;
  d.segments = reinterpret_cast<const ops::AlgSegment*>(base + segs_at);
  d.places = packed ? reinterpret_cast<const ops::AlgSegmentPlace*>(base + places_at) : nullptr;
  d.splits = base + splits_at;
  d.chunks = base + chunks_at;
  d.tile_begin = reinterpret_cast<const int32_t*>(base + tile_begin_at);
  d.cluster_tiles = reinterpret_cast<const ops::AlgRowTile*>(base + cluster_at);
  plans_.push_back(std::move(d));
  return plans_.back();
}

void AlgProj::run_fused(ops::AlgPass pass, const AlgKernel& kernel, const Tensor& a, const Tensor& w,
                        const Tensor* x, const std::vector<int>& types, Tensor& out, bool accumulate,
                        cudaStream_t stream, const Tensor* w2, Tensor* out2, bool swiglu) const {
  QV_CHECK(!kernel.diagonal_gemm || (pass == ops::AlgPass::DW && kernel.kind == AlgKernel::Kind::Tma),
           "algproj: the diagonal GEMM belongs to the TMA weight pass (dW), not to {} for {}", kernel_name(pass, kernel),
           pass_name(pass));
  const DevicePlan& d = plan(pass, kernel, types, stream);
  QV_CHECK(w2 == nullptr || (kernel.kind == AlgKernel::Kind::Gemv && d.num_splits == 0 && !accumulate &&
                             (out2 != nullptr) != swiglu),
           "algproj: a paired call needs the few-row forward without split reductions");
  const int config = kernel.config;
  if (pass == ops::AlgPass::DW) {
    float* dw = static_cast<float*>(out.raw());
    float* partials = d.partials.defined() ? static_cast<float*>(d.partials.raw()) : nullptr;
    if (kernel.kind == AlgKernel::Kind::Tma) {
      QV_CHECK(d.tma_stride > 0,
               "algproj: the TMA weight pass needs row types whose rows run in progressions (cyclic or interval "
               "types; strided ones with M a multiple of q) and group offsets that are multiples of 8");
      QV_CHECK(!kernel.diagonal_gemm || d.diagonal_in > 0,
               "algproj: {} computes the diagonal blocks of dW by one batched GEMM, which needs every type to "
               "reduce each output group over its own input block and groups of one width; {}",
               kernel_name(pass, kernel), d.why_not);
      const int64_t M = static_cast<int64_t>(types.size());
      const int s = d.tma_stride;
      detail::AlgTmaWeightArgs t{};
      t.x = tma_map_bf16(x->raw(), M, K(), K(), detail::kAlgTmaChunk, detail::kAlgTmaChunk);
      t.dy = tma_map_bf16(a.raw(), M, N(), N(), detail::kAlgTmaChunk, detail::kAlgTmaChunk);
      // Strided chunks exist only where M is a multiple of the stride (ops::plan_weight_chunks).
      const bool views = s > 1 && M % s == 0;
      t.xs = views ? tma_map_bf16(x->raw(), M, K(), K(), detail::kAlgTmaChunk, detail::kAlgTmaChunk, s) : t.x;
      t.dys = views ? tma_map_bf16(a.raw(), M, N(), N(), detail::kAlgTmaChunk, detail::kAlgTmaChunk, s) : t.dy;
      t.stride = s;
      t.tiles = static_cast<const ops::AlgWeightTile*>(d.tiles);
      t.chunks = static_cast<const ops::AlgWeightChunk*>(d.chunks);
      t.tile_begin = d.tile_begin;
      t.num_tiles = d.num_tiles;
      t.dw = dw;
      t.lddw = N();
      t.accumulate = accumulate;
      t.partials = partials;
      detail::launch_algproj_tma_weights(t, config, stream);
      if (d.diagonal_in > 0) {
        // Member j: dW[group j's rows, group j's columns] (+)= x[:, in group j]ᵀ · dY[:, out group j]
        // over every row.
        const int64_t in = d.diagonal_in, n_out = d.diagonal_out;
        gemm_batched(true, false, in, n_out, M, 1.0f, x->raw(), DType::BF16, K(), in, a.raw(), DType::BF16, N(),
                     n_out, accumulate ? 1.0f : 0.0f, dw, DType::F32, N(), in * N() + n_out, law_.q(), Epilogue::None,
                     nullptr, DType::F32, 0, stream);
      }
    } else {
      detail::AlgWeightArgs args{};
      args.x = static_cast<const uint16_t*>(x->raw());
      args.ldx = K();
      args.dy = static_cast<const uint16_t*>(a.raw());
      args.ldy = N();
      args.dw = dw;
      args.lddw = N();
      args.accumulate = accumulate;
      args.rows = d.rows;
      args.tiles = static_cast<const ops::AlgWeightTile*>(d.tiles);
      args.num_tiles = d.num_tiles;
      args.partials = partials;
      detail::launch_algproj_weights(args, config, fused_vec_, stream);
    }
    if (d.num_splits > 0) {
      detail::AlgWeightReduceArgs r{};
      r.partials = partials;
      r.slot_rows = d.slot_rows;
      r.slot_cols = d.slot_cols;
      r.splits = static_cast<const ops::AlgWeightSplit*>(d.splits);
      r.num_splits = d.num_splits;
      r.dw = dw;
      r.lddw = N();
      r.accumulate = accumulate;
      detail::launch_algproj_reduce_weights(r, stream);
    }
    return;
  }
  if (kernel.kind == AlgKernel::Kind::Pair) {
    QV_CHECK(d.pair.stride > 0 && w2 == nullptr,
             "algproj: {} needs a pair plan (ops::plan_pair_pass: a graph law, equal group widths, each type's rows "
             "in whole tiles of one progression) whose x boxes it is built for",
             kernel_name(pass, kernel));
    const int64_t M = static_cast<int64_t>(types.size());
    // y's rows leave as TMA boxes: an output these cannot address takes the general fused kernel.
    if (reinterpret_cast<uintptr_t>(out.raw()) % 16 != 0) {
      run_fused(pass, {AlgKernel::Kind::Fused, 0}, a, w, x, types, out, accumulate, stream);
      return;
    }
    const detail::AlgPairConfig& c = detail::kAlgPairConfigs[kernel.config];
    detail::AlgPairArgs t{};
    t.x = tma_map_staging_bf16(const_cast<void*>(a.raw()), M, K(), K(), c.rows, d.pair.slot, d.pair.stride);
    t.w = tma_map_bf16(w.raw(), K(), N(), N(), d.pair.slot, 64);
    t.y = tma_map_staging_bf16(out.raw(), M, N(), N(), 32, 64, d.pair.stride, true);
    if (c.merged_own)
      t.x_own = tma_map_staging_bf16(const_cast<void*>(a.raw()), M, K(), K(), c.rows,
                                     d.pair.slot + detail::kAlgPairOwnGap, d.pair.stride);
    t.tiles = static_cast<const ops::AlgPairTile*>(d.tiles);
    t.segments = d.rows;
    t.num_segments = d.pair.segments;
    t.n = static_cast<int>(N());
    t.stride = d.pair.stride;
    t.in = d.pair.in;
    t.slot = d.pair.slot;
    t.tile_cols = d.pair.tile_cols;
    t.group_cols = d.pair.group_cols;
    t.c = static_cast<uint16_t*>(out.raw());
    t.ldc = N();
    t.accumulate = accumulate;
    detail::launch_algproj_pair(t, kernel.config, stream);
    return;
  }
  if (kernel.kind == AlgKernel::Kind::Tma) {
    QV_CHECK(d.why_not.empty(),
             "algproj: {} runs the forward of a two-group plan (ops::plan_two_group_pass: an even q, every group "
             "over the row type's block and at most its own, equal output groups of at most {} columns, input "
             "blocks of whole 64-column chunks, each tile's rows in one progression); {}",
             kernel_name(pass, kernel), detail::kAlgTmaConfigs[kernel.config].cols, d.why_not);
    QV_CHECK(d.tma_stride > 0 && w2 == nullptr,
             "algproj: the TMA kernel needs each tile's rows in one progression of one stride (cyclic or "
             "interval row types, M a multiple of the stride) and group offsets that are multiples of 8");
    QV_CHECK(!kernel.split ||
                 (pass == ops::AlgPass::DX && detail::tma_cluster_splits(detail::kAlgTmaConfigs[kernel.config])),
             "algproj: {} splits the dX pass only, on a configuration of one warpgroup's 64-row tiles (not "
             "cooperative, tall or two-group)",
             kernel_name(pass, kernel));
    const int64_t M = static_cast<int64_t>(types.size());
    const bool fwd = pass == ops::AlgPass::Forward;
    const int cols = detail::kAlgTmaConfigs[kernel.config].cols;
    detail::AlgTmaArgs t{};
    t.x = tma_map_bf16(a.raw(), M, fwd ? K() : N(), fwd ? K() : N(), detail::kAlgTmaRows, detail::kAlgTmaChunk,
                       d.tma_stride);
    // Forward: boxes of 64 W rows (k) × one 64-column panel; dX: `cols` W rows (dX columns) × 64 (n).
    t.w = tma_map_bf16(w.raw(), K(), N(), N(), fwd ? detail::kAlgTmaChunk : cols, 64);
    t.x16 = tma_map_bf16(a.raw(), M, fwd ? K() : N(), fwd ? K() : N(), detail::kAlgTmaRows, 16, d.tma_stride);
    t.w16 = tma_map_bf16(w.raw(), K(), N(), N(), fwd ? 16 : cols, fwd ? 64 : 16);
    t.w_transposed = !fwd;
    t.row_stride = d.tma_stride;
    t.rows = d.rows;
    t.tiles = static_cast<const ops::AlgRowTile*>(d.tiles);
    t.segments = d.segments;
    t.num_tiles = d.num_tiles;
    t.c = static_cast<uint16_t*>(out.raw());
    t.ldc = fwd ? N() : K();
    t.accumulate = accumulate;
    // Equal output groups (of 8 columns or more) and a stored product: tiles leave by TMA stores.
    const std::vector<int64_t>& groups = fwd ? widths_.out : widths_.in;
    const int64_t group_cols = groups[0];
    const bool equal = std::all_of(groups.begin(), groups.end(), [&](int64_t w) { return w == group_cols; });
    if (equal && group_cols % 8 == 0 && reinterpret_cast<uintptr_t>(out.raw()) % 16 == 0 && !accumulate) {
      t.y = tma_map_groups_bf16(out.raw(), M, law_.q(), group_cols, t.ldc, detail::kAlgTmaRows, d.tma_stride);
      t.out_group_cols = static_cast<int>(group_cols);
      t.view_rows = static_cast<int>(M / d.tma_stride);
    }
    if (d.num_cluster_tiles > 0) {  // the long tiles first, each by a cluster (ops::plan_cluster_split)
      detail::AlgTmaArgs long_tiles = t;
      long_tiles.w = tma_map_bf16(w.raw(), K(), N(), N(), detail::tma_cluster_width(d.cluster_cols), 64);
      long_tiles.tiles = d.cluster_tiles;
      long_tiles.num_tiles = d.num_cluster_tiles;
      detail::launch_algproj_tma_cluster(long_tiles, d.cluster_cols, d.cluster_parts, stream);
    }
    detail::launch_algproj_tma(t, kernel.config, stream);
    return;
  }
  QV_CHECK(d.places == nullptr || pass == ops::AlgPass::Forward, "algproj: {} is a packed configuration, forward only",
           kernel_name(pass, kernel));
  detail::AlgRowArgs args{};
  args.a = static_cast<const uint16_t*>(a.raw());
  args.lda = pass == ops::AlgPass::Forward ? K() : N();
  args.w = static_cast<const uint16_t*>(w.raw());
  args.ldw = N();
  args.w_transposed = pass == ops::AlgPass::DX;
  args.c = static_cast<uint16_t*>(out.raw());
  args.ldc = pass == ops::AlgPass::Forward ? N() : K();
  args.accumulate = accumulate;
  args.rows = d.rows;
  args.tiles = static_cast<const ops::AlgRowTile*>(d.tiles);
  args.segments = d.segments;
  args.places = d.places;
  args.num_tiles = d.num_tiles;
  args.partials = d.partials.defined() ? static_cast<float*>(d.partials.raw()) : nullptr;
  args.slices = d.slices;
  if (w2 != nullptr) {
    args.w2 = static_cast<const uint16_t*>(w2->raw());
    args.c2 = out2 != nullptr ? static_cast<uint16_t*>(out2->raw()) : nullptr;
    args.swiglu = swiglu;
  }
  // Staged tiles of one box shape leave by TMA stores (AlgRowArgs::y).
  const ops::AlgStoreBox& box = d.store_box;
  if (box.rows > 0 && !accumulate && reinterpret_cast<uintptr_t>(out.raw()) % 16 == 0 && args.ldc % 8 == 0) {
    args.y = tma_map_staging_bf16(out.raw(), static_cast<int64_t>(types.size()), args.ldc, args.ldc, box.rows, box.cols,
                                  box.stride);
    args.y_rows = box.rows;
    args.y_stride = box.stride;
  }
  if (kernel.kind == AlgKernel::Kind::Gemv)
    detail::launch_algproj_gemv(args, config, stream);
  else
    detail::launch_algproj_rows(args, config, fused_vec_, stream);
  if (d.num_splits > 0) {
    detail::AlgReduceArgs r{};
    r.partials = args.partials;
    r.slot_rows = d.slot_rows;
    r.slot_cols = d.slot_cols;
    r.splits = static_cast<const ops::AlgSplit*>(d.splits);
    r.num_splits = d.num_splits;
    r.rows = d.rows;
    r.c = args.c;
    r.ldc = args.ldc;
    r.accumulate = accumulate;
    detail::launch_algproj_reduce(r, stream);
  }
}

namespace {
std::atomic<int64_t> g_rejected_candidates{0};
}  // namespace

int64_t AlgProj::rejected_candidates() { return g_rejected_candidates.load(); }

AlgKernel AlgProj::choose(ops::AlgPass pass, const std::vector<int>& types, bool fused_ok, bool tma_ok,
                          cudaStream_t stream, const std::function<void(const AlgKernel&)>& run,
                          const std::function<const Tensor&()>& output) const {
  const AlgKernel products{AlgKernel::Kind::Products, 0};
  const std::optional<AlgKernel>& pin =
      pass == ops::AlgPass::Forward ? pinned_.forward : pass == ops::AlgPass::DX ? pinned_.dx : pinned_.dw;
  if (pin) {
    QV_CHECK(pin->kind == AlgKernel::Kind::Products || fused_supported(),
             "algproj: the fused kernels need even group offsets (law {}); pin the products schedule",
             law_.name());
    QV_CHECK(pin->kind == AlgKernel::Kind::Products || fused_ok,
             "algproj: the pinned fused kernel needs {}-byte aligned tensors", 2 * fused_vec_);
    QV_CHECK(pin->kind != AlgKernel::Kind::Gemv || (pass == ops::AlgPass::Forward && fused_vec_ == 8),
             "algproj: the few-row kernel runs the forward only, with group offsets that are multiples of 8");
    QV_CHECK(pin->kind != AlgKernel::Kind::Pair || (pass == ops::AlgPass::Forward && tma_ok),
             "algproj: the pair kernel runs the forward only, with 16-byte aligned x and W and K, N multiples of 8");
    QV_CHECK(pin->kind != AlgKernel::Kind::Tma || tma_ok,
             "algproj: the TMA kernels need 16-byte aligned inputs and weights (x and dY for dW) and K, N "
             "multiples of 8");
    return *pin;
  }
  // Tensors not aligned for the fused copies (views into a packed buffer, say) use the products.
  if (!fused_ok) return products;
  for (const Choice& c : choices_)
    if (c.pass == pass && c.types == types) return c.kernel;
  const std::string key = fmt::format("algproj23|{}|{}|{}|in={}|out={}|M={}|types={:016x}", device_name_for_keys(),
                                      pass_name(pass), law_.name(), widths_key(widths_.in), widths_key(widths_.out),
                                      types.size(), types_hash(types));
  AlgKernel best{AlgKernel::Kind::Products, 0};
  bool known = false;
  if (std::optional<nlohmann::json> v = kernel_cache().lookup(key)) {
    try {
      const std::string kind = v->at("kernel").get<std::string>();
      const int config = v->at("config").get<int>();
      const int limit = pass == ops::AlgPass::DW ? detail::kAlgWeightConfigCount : detail::kAlgRowConfigCount;
      if (kind == "products" || (kind == "fused" && config >= 0 && config < limit &&
                                 !(pass == ops::AlgPass::DX && detail::kAlgRowConfigs[config].packed))) {
        best = {kind == "products" ? AlgKernel::Kind::Products : AlgKernel::Kind::Fused, config,
                kind == "fused" && pass == ops::AlgPass::DW && v->value("split", false)};
        known = true;
      } else if (kind == "gemv" && pass == ops::AlgPass::Forward && fused_vec_ == 8 && config >= 0 &&
                 config < detail::kAlgGemvConfigCount) {
        best = {AlgKernel::Kind::Gemv, config, v->value("split", false)};
        known = true;
      } else if (kind == "pair" && pass == ops::AlgPass::Forward && tma_ok && config >= 0 &&
                 config < detail::kAlgPairConfigCount) {
        const AlgKernel k{AlgKernel::Kind::Pair, config};
        if (plan(pass, k, types, stream).pair.stride > 0) {
          best = k;
          known = true;
        }
      } else if (kind == "tma" && tma_ok) {
        // One of the pass's candidates (kernel_candidates: a split and a diagonal GEMM only where
        // the pass has them), admitted and with a plan it can run.
        const AlgKernel k{AlgKernel::Kind::Tma, config, v->value("split", false), v->value("diagonal_gemm", false)};
        const std::vector<AlgKernel> all = kernel_candidates(pass);
        if (std::find(all.begin(), all.end(), k) != all.end() && tma_candidate(pass, k)) {
          const DevicePlan& d = plan(pass, k, types, stream);
          if (d.tma_stride > 0 && (!k.diagonal_gemm || d.diagonal_in > 0)) {
            best = k;
            known = true;
          }
        }
      }
    } catch (const std::exception&) {
      // a malformed entry is calibrated again
    }
  }
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  QV_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  const char* env = std::getenv("QUIVER_ALGPROJ_CALIBRATE");
  const bool may_time = capture == cudaStreamCaptureStatusNone && !(env && std::string(env) == "0");
  if (!known && !may_time) {
    // Default: the largest row tile that the smallest type still fills.
    std::vector<int64_t> count(law_.q(), 0);
    for (int t : types) ++count[t];
    int64_t fewest = static_cast<int64_t>(types.size());
    for (int64_t c : count)
      if (c > 0) fewest = std::min(fewest, c);
    const int config = pass == ops::AlgPass::DW ? 0 : fewest >= 64 ? 1 : fewest >= 32 ? 6 : 7;
    return {AlgKernel::Kind::Fused, config};  // not remembered: a later call may calibrate
  }
  if (!known) {
    cudaEvent_t start, stop;
    QV_CUDA_CHECK(cudaEventCreate(&start));
    QV_CUDA_CHECK(cudaEventCreate(&stop));
    // Decode shapes (at most 64 rows) are timed with L2 flushed before each call: in a model's
    // decode step a layer's weights were last read a whole step before and come from DRAM,
    // while back-to-back calls find them in L2, which hides the few-row kernels' re-reading of
    // a tile's blocks (ncu at batch 64: 37.8 µs flushed for a kernel calibrated at 2 × 11.6).
    const bool cold = types.size() <= 64;
    Tensor flush;
    if (cold) {
      int dev = 0, l2 = 0;
      QV_CUDA_CHECK(cudaGetDevice(&dev));
      QV_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
      flush = Tensor::empty({std::max<int64_t>(l2 / 2, 1)}, DType::F32, Device::CUDA);  // 2 × L2 bytes
    }
    // The reference for checking each candidate before it is timed: the products schedule's
    // output (cuBLAS block products, a path of its own) on the same inputs. A candidate that
    // disagrees (a kernel wrong at this shape: a race, a plan it mishandles) is reported and never
    // chosen. Where the reference is not finite (inputs holding NaN or ∞, as uninitialized
    // buffers may) nothing can be judged: the candidates are timed unchecked, as the entry says,
    // rather than all rejected and the products schedule kept for the shape.
    run(products);
    const Tensor& first = output();
    Tensor ref = Tensor::empty(first.shape(), first.dtype(), Device::CUDA);
    QV_CUDA_CHECK(cudaMemcpyAsync(ref.raw(), first.raw(), first.nbytes(), cudaMemcpyDeviceToDevice, stream));
    Tensor sums = Tensor::empty({4}, DType::F64, Device::CUDA);
    auto check = [&] {
      const Tensor& got = output();
      QV_CUDA_CHECK(cudaMemsetAsync(sums.raw(), 0, sums.nbytes(), stream));
      detail::launch_compare_outputs(got.raw(), ref.raw(), got.dtype() == DType::F32, got.numel(),
                                     static_cast<double*>(sums.raw()), stream);
      double host[4];
      QV_CUDA_CHECK(cudaMemcpyAsync(host, sums.raw(), sizeof(host), cudaMemcpyDeviceToHost, stream));
      QV_CUDA_CHECK(cudaStreamSynchronize(stream));
      return OutputDiff{host[0], host[1], host[2], host[3]};
    };
    // The reference against itself gives its norm and largest value: whether it is finite.
    const OutputDiff ref_only = check();
    const bool checked = std::isfinite(ref_only.ref2) && std::isfinite(ref_only.max_ref);
    nlohmann::json rejected = nlohmann::json::object();
    // Each candidate's time as calibrated (cold for decode shapes) and warm.
    std::vector<AlgKernel> timed_kernels;
    std::vector<CandidateTime> times;
    nlohmann::json timings = nlohmann::json::object(), warm_timings = nlohmann::json::object();
    for (const AlgKernel& k : kernel_candidates(pass)) {
      // The few-row kernels read 16-byte weight vectors and pay off only for few rows.
      if (k.kind == AlgKernel::Kind::Gemv && (fused_vec_ != 8 || types.size() > 64)) continue;
      // The TMA row pass: tensors its maps can describe and a plan its boxes can read.
      if (k.kind == AlgKernel::Kind::Tma) {
        if (!tma_candidate(pass, k) || !tma_ok) continue;
        const DevicePlan& d = plan(pass, k, types, stream);
        // A diagonal-GEMM candidate where the diagonal blocks are no batched GEMM is skipped.
        if (d.tma_stride == 0 || d.tma_extra_idle || (k.diagonal_gemm && d.diagonal_in == 0)) continue;
      }
      // The pair kernel: tensors its maps can describe and a pair plan it is built for.
      if (k.kind == AlgKernel::Kind::Pair && (!tma_ok || plan(pass, k, types, stream).pair.stride == 0)) continue;
      // A split candidate whose plan has nothing to split is its unsplit twin.
      if (k.split) {
        const DevicePlan& d = plan(pass, k, types, stream);
        if (k.kind == AlgKernel::Kind::Gemv  ? d.slices == 1
            : k.kind == AlgKernel::Kind::Tma && pass == ops::AlgPass::DX ? d.num_cluster_tiles == 0
                                                                          : d.num_splits == 0)
          continue;
      }
      run(k);  // warm: builds the plan, grows scratch
      const OutputDiff diff = checked ? check() : OutputDiff{};
      if (checked && !outputs_agree(diff)) {
        fmt::print(stderr,
                   "quiver: algproj calibration ({}, law {}, M = {}): {} disagrees with the products schedule "
                   "(relative error {:.3g}, largest difference {:.3g} of values up to {:.3g}); not used\n",
                   pass_name(pass), law_.name(), types.size(), kernel_name(pass, k), diff.rel(), diff.max_diff,
                   diff.max_ref);
        rejected[kernel_name(pass, k)] = diff.rel();
        ++g_rejected_candidates;
        continue;
      }
      // Milliseconds per call over `calls` back-to-back calls between two events.
      auto per_call = [&](int calls) {
        QV_CUDA_CHECK(cudaEventRecord(start, stream));
        for (int c = 0; c < calls; ++c) run(k);
        QV_CUDA_CHECK(cudaEventRecord(stop, stream));
        QV_CUDA_CHECK(cudaEventSynchronize(stop));
        float ms = 0;
        QV_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
        return ms / static_cast<float>(calls);
      };
      // Milliseconds per call over `calls` single calls, each after an L2 flush.
      auto per_cold_call = [&](int calls) {
        float total = 0;
        for (int c = 0; c < calls; ++c) {
          QV_CUDA_CHECK(cudaMemsetAsync(flush.raw(), c & 1, flush.nbytes(), stream));
          QV_CUDA_CHECK(cudaEventRecord(start, stream));
          run(k);
          QV_CUDA_CHECK(cudaEventRecord(stop, stream));
          QV_CUDA_CHECK(cudaEventSynchronize(stop));
          float ms = 0;
          QV_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
          total += ms;
        }
        return total / static_cast<float>(calls);
      };
      // Warm, each timed repeat spans about 50 µs of calls (at most 64), so that a kernel of a
      // few µs is timed by its own duration rather than the events' resolution and the gaps
      // between single launches; cold, 8 flushed calls. The fastest of three repeats counts.
      const int warm_calls = std::clamp(static_cast<int>(0.05f / std::max(per_call(1), 1e-4f)) + 1, 1, 64);
      auto fastest_of_three = [&](auto&& timed) {
        float fastest = timed();
        for (int rep = 1; rep < 3; ++rep) fastest = std::min(fastest, timed());
        return fastest * 1000.0f;
      };
      const float warm_us = fastest_of_three([&] { return per_call(warm_calls); });
      const float us = cold ? fastest_of_three([&] { return per_cold_call(8); }) : warm_us;
      timings[kernel_name(pass, k)] = us;
      if (cold) warm_timings[kernel_name(pass, k)] = warm_us;
      timed_kernels.push_back(k);
      times.push_back({us, warm_us});
    }
    // Decode shapes: the fastest warm of those within 5% of the fastest flushed call (Qwen3-32B
    // at M = 1: the fused 16x64 kernel 12.95 µs flushed, the few-row 1x64 13.38, while warm the
    // few-row kernel took 5.4 µs against 7.4: it reads each weight row once per tile, in 128-byte
    // runs).
    const int pick = pick_calibrated(times, cold);
    float best_us = 0;
    if (pick >= 0) {
      best = timed_kernels[pick];
      best_us = times[pick].us;
    }
    QV_CUDA_CHECK(cudaEventDestroy(start));
    QV_CUDA_CHECK(cudaEventDestroy(stop));
    // Only the chosen kernel's plan stays.
    std::erase_if(plans_, [&](const DevicePlan& d) {
      return d.pass == pass && d.types == types && !(d.kernel == best);
    });
    const char* kind = best.kind == AlgKernel::Kind::Products ? "products"
                       : best.kind == AlgKernel::Kind::Fused  ? "fused"
                       : best.kind == AlgKernel::Kind::Gemv   ? "gemv"
                       : best.kind == AlgKernel::Kind::Pair   ? "pair"
                                                              : "tma";
    nlohmann::json entry = {{"kernel", kind},          {"config", best.config},
                            {"split", best.split},       {"diagonal_gemm", best.diagonal_gemm},
                            {"name", kernel_name(pass, best)},
                            {"us", best_us},             {"l2", cold ? "flushed" : "warm"},
                            {"candidates_us", timings}};
    if (cold) entry["candidates_warm_us"] = warm_timings;
    if (!rejected.empty()) entry["rejected"] = rejected;  // relative error against the products schedule
    if (!checked) entry["checked"] = false;                 // the reference was not finite
    kernel_cache().store(key, entry);
  }
  constexpr size_t kMaxChoices = 24;
  if (choices_.size() >= kMaxChoices) choices_.erase(choices_.begin());
  choices_.push_back({pass, types, best});
  return best;
}

// y = Φ_W(x) by kernel k, assigned or (add) added once.
void AlgProj::forward_run(const AlgKernel& k, const Tensor& x, const Tensor& w, const std::vector<int>& row_types,
                          Tensor& y, bool add, cudaStream_t stream) const {
  if (k.kind != AlgKernel::Kind::Products) {
    run_fused(ops::AlgPass::Forward, k, x, w, nullptr, row_types, y, add, stream);
    return;
  }
  const int64_t M = x.dim(0);
  const Pass p{true, static_cast<const uint16_t*>(x.raw()), K(), N(),
               static_cast<const uint16_t*>(w.raw()), &k_off_, &n_off_, N()};
  auto* out = static_cast<uint16_t*>(add ? ensure(scratch_.sum, M * N() * sizeof(uint16_t)) : y.raw());
  std::vector<RowSet> sets = group_rows(row_types, law_.q(), access_);
  run_pass(p, law_.q(), M, shared_, per_type_, sets, out, scratch_.acc, scratch_.part, scratch_.rows_a,
           scratch_.indices, stream);
  if (add) detail::launch_add_bf16(static_cast<uint16_t*>(y.raw()), out, M * N(), stream);
}

AlgKernel AlgProj::forward_choice(const Tensor& x, const Tensor& w, const std::vector<int>& row_types, Tensor& y,
                                  bool accumulate, cudaStream_t stream) const {
  const int64_t M = x.dim(0);
  const bool fused_ok = fused_supported() && aligned(x.raw(), fused_vec_) && aligned(w.raw(), fused_vec_) &&
                        aligned(y.raw(), fused_vec_);
  // Calibration times assigning calls; an accumulated y keeps its contents (scratch instead).
  Tensor trial;
  auto time_one = [&](const AlgKernel& k) {
    if (accumulate && !trial.defined()) trial = Tensor::empty({M, N()}, DType::BF16, Device::CUDA);
    forward_run(k, x, w, row_types, accumulate ? trial : y, false, stream);
  };
  return choose(ops::AlgPass::Forward, row_types, fused_ok, fused_ok && tma_ok(x.raw(), w.raw()), stream, time_one,
                [&]() -> const Tensor& { return accumulate ? trial : y; });
}

void AlgProj::forward(const Tensor& x, const Tensor& w, const std::vector<int>& row_types,
                      Tensor& y, cudaStream_t stream, bool accumulate) const {
  check_inputs(x, w, K(), N(), row_types.size());
  check_tensor(y, {x.dim(0), N()}, DType::BF16, "y");
  if (x.dim(0) == 0) return;
  // An accumulating call adds once, after the choice.
  const AlgKernel k = forward_choice(x, w, row_types, y, accumulate, stream);
  forward_run(k, x, w, row_types, y, accumulate, stream);
  last_[static_cast<int>(ops::AlgPass::Forward)] = k;
}

void AlgProj::forward_pair(const Tensor& x, const Tensor& w_a, const Tensor& w_b, const std::vector<int>& row_types,
                           Tensor& y_a, Tensor& y_b, cudaStream_t stream) const {
  check_inputs(x, w_b, K(), N(), row_types.size());
  check_tensor(y_b, {x.dim(0), N()}, DType::BF16, "y_b");
  const bool b_aligned = fused_supported() && aligned(w_b.raw(), fused_vec_) && aligned(y_b.raw(), fused_vec_);
  check_inputs(x, w_a, K(), N(), row_types.size());
  check_tensor(y_a, {x.dim(0), N()}, DType::BF16, "y_a");
  if (x.dim(0) == 0) return;
  const AlgKernel k = forward_choice(x, w_a, row_types, y_a, false, stream);
  if (pairs_in_one_launch(k, row_types, b_aligned, stream)) {
    run_fused(ops::AlgPass::Forward, k, x, w_a, nullptr, row_types, y_a, false, stream, &w_b, &y_b);
    last_[static_cast<int>(ops::AlgPass::Forward)] = k;
    return;
  }
  forward_run(k, x, w_a, row_types, y_a, false, stream);
  forward(x, w_b, row_types, y_b, stream);
}

bool AlgProj::pairs_in_one_launch(const AlgKernel& k, const std::vector<int>& row_types, bool extra_aligned,
                                  cudaStream_t stream) const {
  return k.kind == AlgKernel::Kind::Gemv && extra_aligned &&
         plan(ops::AlgPass::Forward, k, row_types, stream).num_splits == 0;
}

void AlgProj::forward_swiglu(const Tensor& x, const Tensor& w_gate, const Tensor& w_up,
                             const std::vector<int>& row_types, Tensor& gate, Tensor& up, Tensor& act,
                             cudaStream_t stream) const {
  check_inputs(x, w_up, K(), N(), row_types.size());
  check_tensor(act, {x.dim(0), N()}, DType::BF16, "act");
  check_tensor(up, {x.dim(0), N()}, DType::BF16, "up");
  const bool up_aligned = fused_supported() && aligned(w_up.raw(), fused_vec_) && aligned(act.raw(), fused_vec_);
  check_inputs(x, w_gate, K(), N(), row_types.size());
  check_tensor(gate, {x.dim(0), N()}, DType::BF16, "gate");
  if (x.dim(0) == 0) return;
  const AlgKernel k = forward_choice(x, w_gate, row_types, gate, false, stream);
  if (pairs_in_one_launch(k, row_types, up_aligned, stream)) {
    run_fused(ops::AlgPass::Forward, k, x, w_gate, nullptr, row_types, act, false, stream, &w_up, nullptr, true);
    last_[static_cast<int>(ops::AlgPass::Forward)] = k;
    return;
  }
  forward_pair(x, w_gate, w_up, row_types, gate, up, stream);
  detail::launch_swiglu_forward(static_cast<const uint16_t*>(gate.raw()), static_cast<const uint16_t*>(up.raw()),
                                static_cast<uint16_t*>(act.raw()), gate.numel(), stream);
}

void AlgProj::backward(const Tensor& x, const Tensor& w, const Tensor& dy,
                       const std::vector<int>& row_types, Tensor* dx, Tensor* dw,
                       cudaStream_t stream, bool accumulate_dw) const {
  check_inputs(x, w, K(), N(), row_types.size());
  const int64_t M = x.dim(0), K = this->K(), N = this->N();
  check_tensor(dy, {M, N}, DType::BF16, "dy");
  if (dx) check_tensor(*dx, {M, K}, DType::BF16, "dx");
  if (dw) check_tensor(*dw, {K, N}, DType::F32, "dw");
  const int q = law_.q();
  const auto* X = static_cast<const uint16_t*>(x.raw());
  const auto* W = static_cast<const uint16_t*>(w.raw());
  const auto* DY = static_cast<const uint16_t*>(dy.raw());
  const bool inputs_ok = fused_supported() && aligned(X, fused_vec_) && aligned(W, fused_vec_) && aligned(DY, fused_vec_);

  // dX[:, β] = Σ dY[:, δ] W_βδᵀ: the forward's pass with the roles of the groups swapped.
  if (dx && M > 0) {
    const Pass p{false, DY, N, K, W, &k_off_, &n_off_, N};
    auto run = [&](const AlgKernel& k) {
      if (k.kind == AlgKernel::Kind::Fused || k.kind == AlgKernel::Kind::Tma) {
        run_fused(ops::AlgPass::DX, k, dy, w, nullptr, row_types, *dx, false, stream);
        return;
      }
      std::vector<RowSet> sets = group_rows(row_types, q, access_);
      run_pass(p, q, M, shared_, per_type_, sets, static_cast<uint16_t*>(dx->raw()), scratch_.acc,
               scratch_.part, scratch_.rows_a, scratch_.indices, stream);
    };
    const bool dx_ok = inputs_ok && aligned(dx->raw(), fused_vec_);
    const AlgKernel k = choose(ops::AlgPass::DX, row_types, dx_ok, dx_ok && tma_ok(DY, W), stream, run,
                               [&]() -> const Tensor& { return *dx; });
    run(k);
    last_[static_cast<int>(ops::AlgPass::DX)] = k;
  }
  if (!dw) return;
  if (M == 0) {
    if (!accumulate_dw) QV_CUDA_CHECK(cudaMemsetAsync(dw->raw(), 0, K * N * sizeof(float), stream));
    return;
  }
  auto run_into = [&](const AlgKernel& k, Tensor& target, bool accumulate) {
    if (k.kind == AlgKernel::Kind::Fused || k.kind == AlgKernel::Kind::Tma) {
      run_fused(ops::AlgPass::DW, k, dy, w, &x, row_types, target, accumulate, stream);
      return;
    }
    const DwProducts p{static_cast<float*>(target.raw()), N, k_off_, n_off_};
    const bool assign_shared = shared_cover_all_ && !accumulate;
    if (!assign_shared && !accumulate)
      QV_CUDA_CHECK(cudaMemsetAsync(p.DW, 0, K * N * sizeof(float), stream));
    for (const Rect& r : shared_) p.product(r, M, X, K, DY, N, assign_shared ? 0.0f : 1.0f, stream);
    std::vector<RowSet> sets = group_rows(row_types, q, access_);
    const int64_t* indices = upload_gathered(sets, per_type_, scratch_.indices, stream);
    for (int a = 0; a < q; ++a) {
      const RowSet& s = sets[a];
      const int64_t m = static_cast<int64_t>(s.rows.size());
      if (m == 0 || per_type_[a].empty()) continue;
      if (s.progression) {
        const int64_t r0 = s.rows[0];
        for (const Rect& r : per_type_[a])
          p.product(r, m, X + r0 * K, s.stride * K, DY + r0 * N, s.stride * N, 1.0f, stream);
      } else {
        const int64_t* idx = indices + s.index_offset;
        auto* xs = static_cast<uint16_t*>(ensure(scratch_.rows_a, m * K * sizeof(uint16_t)));
        auto* dys = static_cast<uint16_t*>(ensure(scratch_.rows_b, m * N * sizeof(uint16_t)));
        detail::launch_gather_rows_bf16(X, K, idx, m, xs, stream);
        detail::launch_gather_rows_bf16(DY, N, idx, m, dys, stream);
        for (const Rect& r : per_type_[a]) p.product(r, m, xs, K, dys, N, 1.0f, stream);
      }
    }
  };
  // Calibration times the candidates into a scratch dW, so an accumulated dw is untouched.
  Tensor trial;
  auto time_one = [&](const AlgKernel& k) {
    if (!trial.defined()) trial = Tensor::empty({K, N}, DType::F32, Device::CUDA);
    run_into(k, trial, false);
  };
  const bool dw_ok = inputs_ok && aligned(dw->raw(), fused_vec_);
  const AlgKernel k = choose(ops::AlgPass::DW, row_types, dw_ok, dw_ok && tma_ok(X, DY), stream, time_one,
                            [&]() -> const Tensor& { return trial; });
  run_into(k, *dw, accumulate_dw);
  last_[static_cast<int>(ops::AlgPass::DW)] = k;
}

}  // namespace quiver::cuda

// Tile plans of the fused algebraic-projection kernels (ops/algproj_tiles.h): every output
// element is owned by exactly one tile, and executing the plans on the CPU in double (what the
// kernels do, in the same tile order) reproduces the independent masked formula of SPEC §1.3
// for the forward, dX and dW, for dense, graph, tensor and block-diagonal laws with equal and
// unequal widths and any row types.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "algebra/law.h"
#include "ops/algproj.h"
#include "ops/algproj_tiles.h"
#include "quiver/rng.h"
#include "testing.h"

using namespace quiver;

namespace {

// y (or dx) [M, out] = Σ over a row plan's tiles; counts how often each element is written.
// Split tiles add into their fp32 slots and the splits then sum the slots in order, as the
// kernels do.
Tensor run_row_plan(const ops::AlgRowPlan& p, const Tensor& in, const Tensor& w, bool transposed,
                    int64_t out_cols, std::vector<int>& writes) {
  const int64_t M = in.dim(0), ld_in = in.dim(1), N = w.dim(1);
  Tensor out = quiver::testing::poisoned({M, out_cols}, DType::F64);
  writes.assign(static_cast<size_t>(M * out_cols), 0);
  const double* X = in.data<double>();
  const double* W = w.data<double>();
  double* Y = out.data<double>();
  const int64_t slot_elems = static_cast<int64_t>(p.slot_rows) * p.slot_cols;
  std::vector<double> slots(static_cast<size_t>(p.num_slots * slot_elems), std::nan(""));
  for (const ops::AlgRowTile& t : p.tiles)
    for (int32_t r = 0; r < t.row_count; ++r) {
      const int64_t m = p.rows[t.row_begin + r];
      for (int32_t c = 0; c < t.ncols; ++c) {
        const int64_t col = t.col0 + c;
        double acc = 0;
        for (int32_t s = 0; s < t.seg_count; ++s) {
          const ops::AlgSegment seg = p.segments[t.seg_begin + s];
          if (!p.places.empty() && (c < p.places[t.seg_begin + s].c0 || c >= p.places[t.seg_begin + s].c1)) continue;
          for (int32_t k = seg.k0; k < seg.k0 + seg.len; ++k)
            acc += X[m * ld_in + k] * (transposed ? W[col * N + k] : W[k * N + col]);
        }
        if (t.slot >= 0) {
          slots[t.slot * slot_elems + r * p.slot_cols + c] = acc;
          continue;
        }
        Y[m * out_cols + col] = acc;
        ++writes[m * out_cols + col];
      }
    }
  for (const ops::AlgSplit& sp : p.splits)
    for (int32_t r = 0; r < sp.row_count; ++r)
      for (int32_t c = 0; c < sp.ncols; ++c) {
        double acc = 0;
        for (int32_t k = 0; k < sp.parts; ++k) acc += slots[(sp.slot0 + k) * slot_elems + r * p.slot_cols + c];
        const int64_t at = p.rows[sp.row_begin + r] * out_cols + sp.col0 + c;
        Y[at] = acc;
        ++writes[at];
      }
  return out;
}

Tensor run_weight_plan(const ops::AlgWeightPlan& p, const Tensor& x, const Tensor& dy,
                       std::vector<int>& writes) {
  const int64_t K = x.dim(1), N = dy.dim(1);
  Tensor dw = quiver::testing::poisoned({K, N}, DType::F64);
  writes.assign(static_cast<size_t>(K * N), 0);
  const int64_t slot_elems = static_cast<int64_t>(p.slot_rows) * p.slot_cols;
  std::vector<double> slots(static_cast<size_t>(p.num_slots * slot_elems), std::nan(""));
  for (const ops::AlgWeightTile& t : p.tiles)
    for (int32_t i = 0; i < t.nk; ++i)
      for (int32_t j = 0; j < t.ncols; ++j) {
        double acc = 0;
        for (int32_t r = 0; r < t.list_count; ++r) {
          const int64_t m = p.rows[t.list_begin + r];
          acc += x.data<double>()[m * K + t.k0 + i] * dy.data<double>()[m * N + t.col0 + j];
        }
        if (t.slot >= 0) {
          slots[t.slot * slot_elems + i * p.slot_cols + j] = acc;
          continue;
        }
        dw.data<double>()[(t.k0 + i) * N + t.col0 + j] = acc;
        ++writes[(t.k0 + i) * N + t.col0 + j];
      }
  for (const ops::AlgWeightSplit& sp : p.splits)
    for (int32_t i = 0; i < sp.nk; ++i)
      for (int32_t j = 0; j < sp.ncols; ++j) {
        double acc = 0;
        for (int32_t k = 0; k < sp.parts; ++k) acc += slots[(sp.slot0 + k) * slot_elems + i * p.slot_cols + j];
        dw.data<double>()[(sp.k0 + i) * N + sp.col0 + j] = acc;
        ++writes[(sp.k0 + i) * N + sp.col0 + j];
      }
  return dw;
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i)
    m = std::max(m, std::abs(a.data<double>()[i] - b.data<double>()[i]));
  return m;
}

// Random float64 x [M, K], dy [M, N] and the reference dW of `law` (the inputs of a dW plan's check).
struct WeightCase {
  Tensor x, dy, dw_ref;
};
WeightCase weight_case(const algebra::Law& law, const algebra::GroupWidths& widths, const std::vector<int>& types,
                       uint64_t seed) {
  const int64_t M = static_cast<int64_t>(types.size()), K = widths.K(), N = widths.N();
  Rng rng(seed);
  WeightCase c{quiver::testing::random_tensor({M, K}, DType::F64, rng), Tensor{}, Tensor::empty({K, N}, DType::F64)};
  const Tensor w = quiver::testing::random_tensor({K, N}, DType::F64, rng);
  c.dy = quiver::testing::random_tensor({M, N}, DType::F64, rng);
  Tensor dx_ref = Tensor::empty({M, K}, DType::F64);
  ops::algproj_reference_backward(c.x, w, c.dy, law, widths, types, dx_ref, c.dw_ref);
  return c;
}

bool each_once(const std::vector<int>& writes) {
  for (int v : writes)
    if (v != 1) return false;
  return true;
}

struct Case {
  std::string law;
  std::vector<int64_t> in, out;  // empty: equal widths of K, N
  int64_t K, N, M;
  bool random_types;
};

void check(const Case& c, int tile_rows, int tile_cols) {
  SCOPED_TRACE(c.law + " tile " + std::to_string(tile_rows) + "x" + std::to_string(tile_cols));
  const algebra::Law law = algebra::Law::parse(c.law);
  const int q = law.q();
  const algebra::GroupWidths widths =
      c.in.empty() ? algebra::GroupWidths::equal(q, c.K, c.N) : algebra::GroupWidths{c.in, c.out};
  const int64_t K = widths.K(), N = widths.N();
  std::vector<int> types = algebra::Schedule::cyclic().types(0, c.M, q);
  Rng rng(7);
  if (c.random_types)
    for (int& t : types) t = static_cast<int>(rng.below(q));
  const Tensor x = quiver::testing::random_tensor({c.M, K}, DType::F64, rng);
  const Tensor w = quiver::testing::random_tensor({K, N}, DType::F64, rng);
  const Tensor dy = quiver::testing::random_tensor({c.M, N}, DType::F64, rng);
  Tensor y_ref = Tensor::empty({c.M, N}, DType::F64);
  Tensor dx_ref = Tensor::empty({c.M, K}, DType::F64), dw_ref = Tensor::empty({K, N}, DType::F64);
  ops::algproj_reference_forward(x, w, law, widths, types, y_ref);
  ops::algproj_reference_backward(x, w, dy, law, widths, types, dx_ref, dw_ref);

  std::vector<int> writes;
  const ops::AlgRowPlan fwd = ops::plan_row_pass(law, widths, types, ops::AlgPass::Forward, tile_rows, tile_cols);
  const Tensor y = run_row_plan(fwd, x, w, false, N, writes);
  EXPECT_TRUE(each_once(writes)) << "forward: an output element is not owned by exactly one tile";
  EXPECT_LT(max_abs_diff(y, y_ref), 1e-9);
  for (const ops::AlgRowTile& t : fwd.tiles) {
    EXPECT_LE(t.row_count, tile_rows);
    EXPECT_LE(t.ncols, tile_cols);
  }

  // The packed forward: the same result, each element once, pieces laid end to end in chunks.
  for (int chunk : {16, 64}) {
    const ops::AlgRowPlan pk =
        ops::plan_row_pass(law, widths, types, ops::AlgPass::Forward, tile_rows, tile_cols, false, chunk);
    SCOPED_TRACE("packed, chunk " + std::to_string(chunk));
    const Tensor yp = run_row_plan(pk, x, w, false, N, writes);
    EXPECT_TRUE(each_once(writes)) << "packed forward: an output element is not owned by exactly one tile";
    EXPECT_LT(max_abs_diff(yp, y_ref), 1e-9);
    EXPECT_EQ(pk.macs, fwd.macs);
    ASSERT_EQ(pk.places.size(), pk.segments.size());
    for (const ops::AlgRowTile& t : pk.tiles) {
      EXPECT_LE(t.ncols, tile_cols);
      int32_t end = 0, pieces = 0;
      for (int32_t s = 0; s < t.seg_count; ++s) {
        const ops::AlgSegment seg = pk.segments[t.seg_begin + s];
        const ops::AlgSegmentPlace pl = pk.places[t.seg_begin + s];
        if (pl.kpos == 0) end = 0, pieces = 0;
        EXPECT_EQ(pl.kpos, end) << "a piece that neither starts a chunk nor follows the one before";
        EXPECT_TRUE(s > 0 || pl.kpos == 0);
        EXPECT_GT(seg.len, 0);
        EXPECT_LE(pl.kpos + seg.len, chunk);
        EXPECT_LE(++pieces, ops::kAlgPackMaxPieces);
        EXPECT_TRUE(0 <= pl.c0 && pl.c0 < pl.c1 && pl.c1 <= t.ncols);
        end = pl.kpos + seg.len;
      }
    }
  }

  const ops::AlgRowPlan dxp = ops::plan_row_pass(law, widths, types, ops::AlgPass::DX, tile_rows, tile_cols);
  const Tensor dx = run_row_plan(dxp, dy, w, true, K, writes);
  EXPECT_TRUE(each_once(writes)) << "dX: an output element is not owned by exactly one tile";
  EXPECT_LT(max_abs_diff(dx, dx_ref), 1e-9);

  const ops::AlgWeightPlan dwp = ops::plan_weight_pass(law, widths, types, tile_rows, tile_cols);
  const Tensor dw = run_weight_plan(dwp, x, dy, writes);
  EXPECT_TRUE(each_once(writes)) << "dW: an element is not owned by exactly one tile";
  EXPECT_LT(max_abs_diff(dw, dw_ref), 1e-9);

  // The forward's multiply-adds are the law's arithmetic: Σ over rows of the type's cost.
  const std::vector<double> cost = algebra::type_costs(law, widths);
  double expected = 0;
  for (int t : types) expected += cost[t];
  EXPECT_EQ(static_cast<double>(fwd.macs), expected);
  EXPECT_EQ(dxp.macs, fwd.macs);
  EXPECT_EQ(dwp.macs, fwd.macs);
}

TEST(AlgProjTiles, PlansReproduceTheFormula) {
  const std::vector<Case> cases = {
      {"dense:4", {}, {}, 32, 48, 9, false},
      {"Q4", {}, {}, 32, 48, 13, false},
      {"Q2xQ2", {}, {}, 48, 32, 11, true},
      {"graph:4:0>1,1>2,2>3", {}, {}, 32, 32, 10, true},
      {"blockdiag:4", {}, {}, 16, 24, 7, false},
      {"Q4", {8, 24, 5, 27}, {16, 3, 40, 13}, 0, 0, 17, true},
  };
  for (const Case& c : cases)
    for (auto [tr, tc] : {std::pair{2, 8}, std::pair{4, 16}, std::pair{64, 128}}) check(c, tr, tc);
}

// Narrow groups pack: Q_8 with output groups of 12 and reductions of 4 in tiles of 32 columns
// takes two whole groups a tile, reduced over the type's block once and each group's own block
// over its 12 columns, all in one chunk of 16; a plan for dX cannot be packed.
TEST(AlgProjTiles, PackedTilesTakeWholeGroups) {
  const algebra::Law law = algebra::Law::parse("Q8");
  const algebra::GroupWidths widths = algebra::GroupWidths::equal(8, 32, 96);
  const std::vector<int> types = algebra::Schedule::cyclic().types(0, 64, 8);
  const ops::AlgRowPlan p = ops::plan_row_pass(law, widths, types, ops::AlgPass::Forward, 8, 32, false, 16);
  ASSERT_EQ(p.tiles.size(), 8u * 4u);  // 8 classes of 8 rows, 4 column tiles of 24
  for (const ops::AlgRowTile& t : p.tiles) {
    EXPECT_EQ(t.ncols, 24);
    EXPECT_EQ(t.col0 % 24, 0);
    EXPECT_LE(t.seg_count, 3);
    for (int32_t s = 0; s < t.seg_count; ++s) EXPECT_EQ(p.places[t.seg_begin + s].kpos == 0, s == 0);
  }
  try {
    ops::plan_row_pass(law, widths, types, ops::AlgPass::DX, 8, 32, false, 16);
    ADD_FAILURE() << "a packed dX plan was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("packed plans are forward plans"), std::string::npos) << e.what();
  }
}

TEST(AlgProjTiles, DenseLawIsOneClassAndQqIsLongestFirst) {
  const algebra::Law dense = algebra::Law::parse("dense:4");
  const algebra::GroupWidths w = algebra::GroupWidths::equal(4, 64, 64);
  const std::vector<int> types = algebra::Schedule::cyclic().types(0, 8, 4);
  const ops::AlgRowPlan p = ops::plan_row_pass(dense, w, types, ops::AlgPass::Forward, 8, 64);
  ASSERT_EQ(p.tiles.size(), 4u);  // all rows in one class, one tile per output group
  for (const ops::AlgRowTile& t : p.tiles) {
    EXPECT_EQ(t.row_count, 8);
    ASSERT_EQ(t.seg_count, 1);  // the four input groups merge into one segment
    EXPECT_EQ(p.segments[t.seg_begin].len, 64);
  }
  // Q4 dX: type α's own group reduces over every output group, so those tiles come first.
  const algebra::Law q4 = algebra::Law::complete(4);
  const ops::AlgRowPlan d = ops::plan_row_pass(q4, w, types, ops::AlgPass::DX, 8, 64);
  int64_t prev = 1 << 30;
  for (const ops::AlgRowTile& t : d.tiles) {
    int64_t len = 0;
    for (int s = 0; s < t.seg_count; ++s) len += d.segments[t.seg_begin + s].len;
    EXPECT_LE(len, prev);
    prev = len;
  }
  EXPECT_EQ(prev, 16);  // the shortest: dx_β = dy_β W_ββᵀ
}

// Q16 dX: a type's own group reduces over all N = 2048 columns, the others over 128, so the long
// tiles are cut into pieces (each at most 512 long, cut at multiples of 64) whose slots the
// splits sum; the result is still the formula, and no plan without split has slots.
TEST(AlgProjTiles, LongReductionsAreSplit) {
  const algebra::Law q16 = algebra::Law::complete(16);
  const algebra::GroupWidths widths = algebra::GroupWidths::equal(16, 512, 2048);
  const std::vector<int> types = algebra::Schedule::cyclic().types(0, 32, 16);
  Rng rng(3);
  const Tensor dy = quiver::testing::random_tensor({32, 2048}, DType::F64, rng);
  const Tensor w = quiver::testing::random_tensor({512, 2048}, DType::F64, rng);
  const Tensor x = quiver::testing::random_tensor({32, 512}, DType::F64, rng);
  Tensor dx_ref = Tensor::empty({32, 512}, DType::F64), dw_ref = Tensor::empty({512, 2048}, DType::F64);
  ops::algproj_reference_backward(x, w, dy, q16, widths, types, dx_ref, dw_ref);

  const ops::AlgRowPlan p = ops::plan_row_pass(q16, widths, types, ops::AlgPass::DX, 2, 8);
  ASSERT_FALSE(p.splits.empty());
  int32_t slots = 0;
  for (const ops::AlgSplit& sp : p.splits) {
    EXPECT_EQ(sp.slot0, slots);
    EXPECT_EQ(sp.parts, 4);  // 2048 / 512
    slots += sp.parts;
  }
  EXPECT_EQ(slots, p.num_slots);
  for (const ops::AlgRowTile& t : p.tiles) {
    int64_t len = 0;
    for (int s = 0; s < t.seg_count; ++s) len += p.segments[t.seg_begin + s].len;
    EXPECT_LE(len, 512);
    if (t.slot >= 0)
      for (int s = 0; s < t.seg_count; ++s) EXPECT_EQ(p.segments[t.seg_begin + s].k0 % ops::kAlgSplitAlign, 0);
  }
  std::vector<int> writes;
  const Tensor dx = run_row_plan(p, dy, w, true, 512, writes);
  EXPECT_TRUE(each_once(writes));
  EXPECT_LT(max_abs_diff(dx, dx_ref), 1e-9);

  const ops::AlgRowPlan whole = ops::plan_row_pass(q16, widths, types, ops::AlgPass::DX, 2, 8, false);
  EXPECT_TRUE(whole.splits.empty());
  EXPECT_EQ(whole.num_slots, 0);
  EXPECT_EQ(whole.macs, p.macs);
}

// Q16 dW: the diagonal blocks reduce over all M = 2048 rows, the others over one type's 128,
// so the diagonal tiles' row lists are cut into pieces of 512 summed in order.
TEST(AlgProjTiles, LongRowListsAreSplit) {
  const algebra::Law q16 = algebra::Law::complete(16);
  const algebra::GroupWidths widths = algebra::GroupWidths::equal(16, 64, 64);
  const std::vector<int> types = algebra::Schedule::cyclic().types(0, 2048, 16);
  const auto [x, dy, dw_ref] = weight_case(q16, widths, types, 8);
  const ops::AlgWeightPlan p = ops::plan_weight_pass(q16, widths, types, 4, 4);
  ASSERT_EQ(p.splits.size(), 16u);  // one 4 × 4 tile per diagonal block
  for (const ops::AlgWeightSplit& sp : p.splits) EXPECT_EQ(sp.parts, 4);
  for (const ops::AlgWeightTile& t : p.tiles) EXPECT_LE(t.list_count, 512);
  std::vector<int> writes;
  const Tensor dw = run_weight_plan(p, x, dy, writes);
  EXPECT_TRUE(each_once(writes));
  EXPECT_LT(max_abs_diff(dw, dw_ref), 1e-9);
  // Unsplit (the calibration's other candidate): whole lists, the same products.
  const ops::AlgWeightPlan whole = ops::plan_weight_pass(q16, widths, types, 4, 4, false);
  EXPECT_TRUE(whole.splits.empty());
  EXPECT_EQ(whole.num_slots, 0);
  EXPECT_EQ(whole.macs, p.macs);
  EXPECT_EQ(whole.tiles.front().list_count, 2048);
  writes.clear();
  EXPECT_LT(max_abs_diff(run_weight_plan(whole, x, dy, writes), dw_ref), 1e-9);
  EXPECT_TRUE(each_once(writes));
}

// Q2⊗Q2 dW at a large M: 16 tiles whose lists (8192, 4096 or 2048 rows) are within twice the
// median, so the median rule splits nothing; asked for 64 pieces, the lists are cut into pieces
// of about (rows of all lists) / 64, and the sums stay those of the whole lists.
TEST(AlgProjTiles, FewTilesAreSplit) {
  const algebra::Law law = algebra::Law::parse("Q2xQ2");
  const algebra::GroupWidths widths = algebra::GroupWidths::equal(4, 32, 32);
  const std::vector<int> types = algebra::Schedule::cyclic().types(0, 8192, 4);
  const auto [x, dy, dw_ref] = weight_case(law, widths, types, 9);
  const ops::AlgWeightPlan median_only = ops::plan_weight_pass(law, widths, types, 8, 8);
  ASSERT_EQ(median_only.tiles.size(), 16u);  // one 8 × 8 tile per block
  EXPECT_TRUE(median_only.splits.empty());
  int64_t total = 0;
  for (const ops::AlgWeightTile& t : median_only.tiles) total += t.list_count;
  const int64_t piece = (total / 64 + ops::kAlgSplitAlign - 1) / ops::kAlgSplitAlign * ops::kAlgSplitAlign;
  const ops::AlgWeightPlan p = ops::plan_weight_pass(law, widths, types, 8, 8, true, 64);
  EXPECT_FALSE(p.splits.empty());
  EXPECT_GE(p.tiles.size(), 64u);
  for (const ops::AlgWeightTile& t : p.tiles) EXPECT_LE(t.list_count, 2 * piece);
  EXPECT_EQ(p.macs, median_only.macs);
  std::vector<int> writes;
  EXPECT_LT(max_abs_diff(run_weight_plan(p, x, dy, writes), dw_ref), 1e-9);
  EXPECT_TRUE(each_once(writes));
  // Pieces are never shorter than 512 rows, however many are asked for.
  for (const ops::AlgWeightTile& t : ops::plan_weight_pass(law, widths, types, 8, 8, true, 100000).tiles)
    EXPECT_EQ(t.list_count, 512);
}

// dW as the diagonal-GEMM configurations compute it: the weight plan without the diagonal blocks'
// tiles, and then each diagonal block (j, j) as x[:, input group j]ᵀ · dY[:, output group j] over
// every row (the batched GEMM's member j): the formula, every element written once.
TEST(AlgProjTiles, DiagonalGemmAndTheRestAreTheFormula) {
  struct DiagCase {
    std::string law;
    int64_t K, N, M;
    bool random_types;
  };
  const DiagCase cases[] = {
      {"Q16", 512, 2048, 2048, false},  // Q_16: 2048 rows on the diagonal against 128
      {"Q2xQ2", 96, 160, 300, false},    // a tensor law, partial tiles
      {"Q4", 64, 48, 77, true},          // any row types
      {"graph:4:0>1,1>2,2>3", 128, 64, 64, false},
  };
  for (const DiagCase& c : cases) {
    SCOPED_TRACE(c.law);
    const algebra::Law law = algebra::Law::parse(c.law);
    const int q = law.q();
    const algebra::GroupWidths widths = algebra::GroupWidths::equal(q, c.K, c.N);
    std::vector<int> types = algebra::Schedule::cyclic().types(0, c.M, q);
    if (c.random_types) {
      Rng rng(5);
      for (int& t : types) t = static_cast<int>(rng.next_u64() % static_cast<uint64_t>(q));
    }
    const ops::AlgDiagonalGemm diag = ops::plan_diagonal_gemm(law, widths);
    ASSERT_TRUE(diag.why_not.empty()) << diag.why_not;
    EXPECT_EQ(diag.in, c.K / q);
    EXPECT_EQ(diag.out, c.N / q);
    const auto [x, dy, dw_ref] = weight_case(law, widths, types, 11);
    ops::AlgWeightPlan p = ops::plan_weight_pass(law, widths, types, 32, 64, false);
    const size_t all_tiles = p.tiles.size();
    const int64_t macs = p.macs;
    ops::drop_diagonal_tiles(p, widths);
    EXPECT_LT(p.tiles.size(), all_tiles);
    EXPECT_EQ(p.macs, macs);
    std::vector<int> writes;
    Tensor dw = run_weight_plan(p, x, dy, writes);
    const int64_t K = c.K, N = c.N, M = c.M;
    for (int j = 0; j < q; ++j)
      for (int64_t i = 0; i < diag.in; ++i)
        for (int64_t o = 0; o < diag.out; ++o) {
          const int64_t k = j * diag.in + i, n = j * diag.out + o;
          double acc = 0;
          for (int64_t m = 0; m < M; ++m) acc += x.data<double>()[m * K + k] * dy.data<double>()[m * N + n];
          dw.data<double>()[k * N + n] = acc;
          ++writes[static_cast<size_t>(k * N + n)];
        }
    EXPECT_TRUE(each_once(writes));
    EXPECT_LT(max_abs_diff(dw, dw_ref), 1e-9);
  }
  // Where it does not apply, it says why.
  EXPECT_NE(ops::plan_diagonal_gemm(algebra::Law::complete(4), algebra::GroupWidths{{8, 8, 8, 16}, {8, 8, 8, 8}})
                .why_not.find("one width"),
            std::string::npos);
  const algebra::Law no_own = algebra::Law::from_table(2, {{1}, {0}, {1}, {0}});  // B(α, δ) = {1 − δ}
  const ops::AlgDiagonalGemm none = ops::plan_diagonal_gemm(no_own, algebra::GroupWidths::equal(2, 16, 16));
  EXPECT_EQ(none.in, 0);
  EXPECT_NE(none.why_not.find("own input block"), std::string::npos) << none.why_not;
  ops::AlgWeightPlan split = ops::plan_weight_pass(algebra::Law::parse("Q2xQ2"), algebra::GroupWidths::equal(4, 32, 32),
                                                   algebra::Schedule::cyclic().types(0, 8192, 4), 8, 8, true, 64);
  ASSERT_FALSE(split.splits.empty());
  EXPECT_THROW(ops::drop_diagonal_tiles(split, algebra::GroupWidths::equal(4, 32, 32)), Error);
}

// The stride the TMA row pass reads a plan's tiles with: q for cyclic types, 1 for contiguous
// ones and single rows; 0 for irregular rows or M not a multiple of the stride.
TEST(AlgProjTiles, UniformRowStride) {
  const algebra::Law q4 = algebra::Law::complete(4);
  const algebra::GroupWidths widths = algebra::GroupWidths::equal(4, 320, 256);
  auto stride = [&](const std::vector<int>& types) {
    const ops::AlgRowPlan p = ops::plan_row_pass(q4, widths, types, ops::AlgPass::Forward, 64, 128, false);
    return ops::uniform_row_stride(p, static_cast<int64_t>(types.size()));
  };
  EXPECT_EQ(stride(algebra::Schedule::cyclic().types(0, 260, 4)), 4);
  EXPECT_EQ(stride(algebra::Schedule::interval(300).types(0, 300, 4)), 1);
  EXPECT_EQ(stride({2}), 1);
  EXPECT_EQ(stride(algebra::Schedule::cyclic().types(0, 261, 4)), 0);  // 261 rows: not a multiple of 4
  EXPECT_EQ(stride({3, 1, 3}), 0);                                      // type 3 at stride 2, 3 rows
  EXPECT_EQ(stride({0, 1, 0, 0}), 0);                                   // type 0 at rows 0, 2, 3
  // Boxes start at 16-byte boundaries: groups of 24 columns do, groups of 20 do not.
  auto stride_of = [&](int in, int out) {
    const std::vector<int> types = algebra::Schedule::cyclic().types(0, 260, 4);
    const ops::AlgRowPlan p = ops::plan_row_pass(q4, algebra::GroupWidths::equal(4, 4 * in, 4 * out), types,
                                                 ops::AlgPass::Forward, 64, 128, false);
    return ops::uniform_row_stride(p, static_cast<int64_t>(types.size()));
  };
  EXPECT_EQ(stride_of(24, 104), 4);
  EXPECT_EQ(stride_of(20, 104), 0);  // segments from column 20
  EXPECT_EQ(stride_of(24, 100), 0);  // output tiles from column 100
}

// The box shape of TMA stores from a staged row pass: one where every tile has the same rows (one
// progression) and columns, whatever the reduction columns; none for uneven classes, tiles
// narrower at the end, misaligned or over-wide columns, or split reductions.
TEST(AlgProjTiles, UniformStoreBox) {
  const algebra::Law q16 = algebra::Law::complete(16);
  auto box = [&](const std::vector<int>& types, int in, int out, int tile_rows, int tile_cols, int pack,
                 ops::AlgPass pass = ops::AlgPass::Forward) {
    const ops::AlgRowPlan p = ops::plan_row_pass(q16, algebra::GroupWidths::equal(16, 16 * in, 16 * out), types, pass,
                                                 tile_rows, tile_cols, pack == 0, pack);
    return ops::uniform_store_box(p, static_cast<int64_t>(types.size()));
  };
  // Qwen3-32B's q = 256 in miniature: groups of 20 and 100, packed tiles of two groups.
  ops::AlgStoreBox b = box(algebra::Schedule::cyclic().types(0, 2048, 16), 20, 100, 128, 256, 64);
  EXPECT_EQ(b.rows, 128);
  EXPECT_EQ(b.cols, 200);
  EXPECT_EQ(b.stride, 16);
  b = box(algebra::Schedule::cyclic().types(0, 512, 16), 20, 100, 128, 256, 64);  // 32 rows a type
  EXPECT_EQ(b.rows, 32);
  EXPECT_EQ(b.stride, 16);
  b = box(algebra::Schedule::interval(2048).types(0, 2048, 16), 20, 100, 64, 256, 64);  // contiguous runs
  EXPECT_EQ(b.rows, 64);
  EXPECT_EQ(b.cols, 200);
  EXPECT_EQ(b.stride, 1);
  EXPECT_EQ(box(algebra::Schedule::cyclic().types(0, 300, 16), 20, 100, 128, 256, 64).rows, 0);  // 18 or 19 rows
  EXPECT_EQ(box(algebra::Schedule::cyclic().types(0, 2048, 16), 20, 100, 128, 128, 64).rows, 0);  // columns from 100
  EXPECT_EQ(box(algebra::Schedule::cyclic().types(0, 2048, 16), 20, 300, 128, 256, 64).rows, 0);  // 256 + 44
  EXPECT_EQ(box(algebra::Schedule::cyclic().types(0, 2048, 16), 20, 104, 128, 128, 0).cols, 104);  // one group a tile
  // Q16's dX of a type's own group reduces over all N columns: split, so no box.
  EXPECT_EQ(box(algebra::Schedule::cyclic().types(0, 2048, 16), 16, 128, 128, 128, 0, ops::AlgPass::DX).rows, 0);
}

// y of a pair plan as the pair kernel computes it (algproj_pair.cu): per tile and group, each x box
// from the 8-column boundary at or below its block, positions outside [lead, lead + in) and the
// typed box of a group that does not reduce over it counted as zero, W's rows at the same
// positions and the group's box columns; counts how often each element is written.
Tensor run_pair_plan(const ops::AlgPairPlan& p, const Tensor& x, const Tensor& w, int tile_rows, int groups,
                     std::vector<int>& writes) {
  const int64_t M = x.dim(0), K = x.dim(1), N = w.dim(1);
  Tensor out = quiver::testing::poisoned({M, N}, DType::F64);
  writes.assign(static_cast<size_t>(M * N), 0);
  const double* X = x.data<double>();
  const double* W = w.data<double>();
  double* Y = out.data<double>();
  for (const ops::AlgPairTile& t : p.tiles)
    for (int g = 0; g < groups; ++g) {
      EXPECT_EQ(t.w_col[g] % ops::kAlgTmaAlign, 0);
      for (int i = 0; i < tile_rows; ++i) {
        const int64_t m = t.row0 + static_cast<int64_t>(p.stride) * i;
        for (int bc = t.shift[g]; bc < t.shift[g] + p.group_cols; ++bc) {
          const int64_t col = t.w_col[g] + bc;
          double sum = 0;
          for (int typed = 0; typed < 2; ++typed) {
            const int k0 = typed ? t.k_typed : t.k_own[g], lead = k0 % 8;
            for (int o = 0; o < p.slot; ++o) {
              const int64_t k = k0 - lead + o;
              const bool counted = o >= lead && o < lead + p.in && (!typed || ((t.typed >> g) & 1));
              if (counted && k < K) sum += X[m * K + k] * W[k * N + col];
            }
          }
          Y[m * N + col] = sum;
          ++writes[static_cast<size_t>(m * N + col)];
        }
      }
    }
  return out;
}

TEST(AlgProjTiles, PairPlansReproduceTheFormula) {
  struct PairCase {
    std::string law;
    int64_t in, out, M;
    bool interval;
    int tile_rows, groups, box;
    int slot, tile_cols, stride, own_gap;
  };
  // Qwen3-32B's q = 256 in miniature (blocks of 20 at leads 0 and 4, groups of 100 in pairs),
  // q = 128's (blocks of 40, groups of 200), a group cut in two (400 → 200 + 200), a graph law
  // (groups without the typed block), interval rows (stride 1), blocks of 18 (leads 0..6), and
  // pairs of groups whose own blocks lie 40 columns apart (own_gap 40, no merged box).
  const PairCase cases[] = {
      {"Q16", 20, 100, 512, false, 32, 2, 128, 24, 200, 16, 16},
      {"Q8", 40, 200, 512, false, 64, 1, 256, 40, 200, 8, 0},
      {"Q4", 40, 400, 256, false, 64, 1, 256, 40, 200, 4, 0},
      {"graph:4:0>1,1>2,2>3,3>0", 20, 100, 256, false, 64, 2, 128, 24, 200, 4, 16},
      {"Q16", 20, 100, 512, true, 32, 2, 128, 24, 200, 1, 16},
      {"Q8", 18, 24, 512, false, 64, 2, 128, 24, 48, 8, 16},
      {"Q4", 40, 40, 256, false, 64, 2, 128, 40, 80, 4, 40},
  };
  for (const PairCase& c : cases) {
    const algebra::Law law = algebra::Law::parse(c.law);
    const int q = law.q();
    SCOPED_TRACE(c.law + " in " + std::to_string(c.in) + " out " + std::to_string(c.out));
    const algebra::GroupWidths widths = algebra::GroupWidths::equal(q, q * c.in, q * c.out);
    const std::vector<int> types = c.interval ? algebra::Schedule::interval(c.M).types(0, c.M, q)
                                              : algebra::Schedule::cyclic().types(0, c.M, q);
    const ops::AlgPairPlan p = ops::plan_pair_pass(law, widths, types, c.tile_rows, c.groups, c.box);
    ASSERT_FALSE(p.tiles.empty()) << p.why_not;
    EXPECT_EQ(p.slot, c.slot);
    EXPECT_EQ(p.tile_cols, c.tile_cols);
    EXPECT_EQ(p.stride, c.stride);
    EXPECT_EQ(p.own_gap, c.own_gap);
    for (const ops::AlgPairTile& t : p.tiles)  // every tile's groups' own boxes lie that far apart
      if (p.own_gap > 0) EXPECT_EQ((t.k_own[1] & ~7) - (t.k_own[0] & ~7), p.own_gap);
    // Segments: exactly the tiles starting on a 64-column boundary, then the end; a tile that does
    // not start one continues its predecessor's row.
    std::vector<int32_t> starts;
    for (size_t i = 0; i < p.tiles.size(); ++i) {
      const ops::AlgPairTile& t = p.tiles[i];
      if (t.col0 % 64 == 0) {
        starts.push_back(static_cast<int32_t>(i));
      } else {
        ASSERT_GT(i, 0u);
        EXPECT_EQ(t.row0, p.tiles[i - 1].row0);
        EXPECT_EQ(t.col0, p.tiles[i - 1].col0 + p.tile_cols);
      }
    }
    starts.push_back(static_cast<int32_t>(p.tiles.size()));
    EXPECT_EQ(p.segments, starts);
    Rng rng(41);
    const Tensor x = quiver::testing::random_tensor({c.M, widths.K()}, DType::F64, rng);
    const Tensor w = quiver::testing::random_tensor({widths.K(), widths.N()}, DType::F64, rng);
    Tensor ref = Tensor::empty({c.M, widths.N()}, DType::F64);
    ops::algproj_reference_forward(x, w, law, widths, types, ref);
    std::vector<int> writes;
    const Tensor y = run_pair_plan(p, x, w, c.tile_rows, c.groups, writes);
    EXPECT_TRUE(each_once(writes));
    EXPECT_LT(max_abs_diff(y, ref), 1e-9);
    // The plan's products: each type's rows times its support, as the law counts them.
    int64_t macs = 0;
    for (int t : types)
      for (int d = 0; d < q; ++d) macs += static_cast<int64_t>(law.support(t, d).size()) * c.in * c.out;
    EXPECT_EQ(p.macs, macs);
  }
}

TEST(AlgProjTiles, PairPlansSayWhyNot) {
  const std::vector<int> cyclic = algebra::Schedule::cyclic().types(0, 2048, 16);
  auto why = [](const algebra::Law& law, const algebra::GroupWidths& widths, const std::vector<int>& types,
                int tile_rows, int groups, int box) {
    const ops::AlgPairPlan p = ops::plan_pair_pass(law, widths, types, tile_rows, groups, box);
    EXPECT_TRUE(p.tiles.empty());
    return p.why_not;
  };
  const algebra::GroupWidths narrow = algebra::GroupWidths::equal(16, 320, 1600);
  EXPECT_NE(why(algebra::Law::parse("Q4xQ4"), narrow, cyclic, 128, 2, 128).find("other than"), std::string::npos);
  EXPECT_NE(why(algebra::Law::dense(16), narrow, cyclic, 128, 2, 128).find("other than"), std::string::npos);
  const algebra::GroupWidths unequal{std::vector<int64_t>(15, 20), std::vector<int64_t>(15, 100)};
  std::vector<int64_t> in = unequal.in, out = unequal.out;
  in.push_back(22);
  out.push_back(98);
  EXPECT_NE(why(algebra::Law::complete(16), algebra::GroupWidths{in, out}, cyclic, 128, 2, 128).find("unequal"),
            std::string::npos);
  EXPECT_NE(why(algebra::Law::complete(16), narrow, algebra::Schedule::cyclic().types(0, 2000, 16), 128, 2, 128)
                .find("whole tiles"),
            std::string::npos);
  std::vector<int> shuffled = cyclic;
  std::swap(shuffled[0], shuffled[16]);
  std::swap(shuffled[1], shuffled[16]);
  EXPECT_NE(why(algebra::Law::complete(16), narrow, shuffled, 128, 2, 128).find("progression"), std::string::npos);
  // W boxes of 64 columns: a group of 100 does not fit.
  EXPECT_NE(why(algebra::Law::complete(16), narrow, cyclic, 128, 2, 64).find("W box"),
            std::string::npos);
  EXPECT_NE(why(algebra::Law::complete(15), algebra::GroupWidths::equal(15, 300, 1500),
                algebra::Schedule::cyclic().types(0, 1920, 15), 128, 2, 128)
                .find("odd number"),
            std::string::npos);
}

// A two-group plan run as the kernel runs it: segment 0 on both groups of the tile, segment 1 on
// the left group's columns only, segment 2 on the right group's.
Tensor run_two_group_plan(const ops::AlgRowPlan& p, const Tensor& x, const Tensor& w, std::vector<int>& writes) {
  const int64_t M = x.dim(0), K = x.dim(1), N = w.dim(1);
  Tensor out = quiver::testing::poisoned({M, N}, DType::F64);
  writes.assign(static_cast<size_t>(M * N), 0);
  const double* X = x.data<double>();
  const double* W = w.data<double>();
  for (const ops::AlgRowTile& t : p.tiles) {
    EXPECT_EQ(t.seg_count, 3);
    EXPECT_EQ(t.slot, -1);
    const int32_t half = t.ncols / 2;
    for (int32_t r = 0; r < t.row_count; ++r) {
      const int64_t m = p.rows[t.row_begin + r];
      for (int32_t c = 0; c < t.ncols; ++c) {
        const int64_t col = t.col0 + c;
        double acc = 0;
        for (int32_t s = 0; s < 3; ++s) {
          if ((s == 1 && c >= half) || (s == 2 && c < half)) continue;
          const ops::AlgSegment seg = p.segments[t.seg_begin + s];
          for (int32_t k = seg.k0; k < seg.k0 + seg.len; ++k) acc += X[m * K + k] * W[k * N + col];
        }
        out.data<double>()[m * N + col] = acc;
        ++writes[static_cast<size_t>(m * N + col)];
      }
    }
  }
  return out;
}

TEST(AlgProjTiles, TwoGroupPlansReproduceTheFormula) {
  struct TwoCase {
    std::string law;
    int64_t in, out, M;
    bool interval;
    int tile_rows, half_cols;
  };
  // Qwen3-30B-A3B's expert in miniature (Q_16, blocks of 128 into groups of 48, 128-row tiles of
  // a class's 32 rows), groups narrower than the half tile, interval rows, and a class cut into
  // several tiles with a short last one.
  const TwoCase cases[] = {
      {"Q16", 128, 48, 512, false, 128, 48}, {"Q8", 64, 40, 256, false, 128, 64},
      {"Q4", 64, 16, 256, true, 128, 48},    {"Q4", 128, 24, 640, false, 64, 32},
  };
  for (const TwoCase& c : cases) {
    const algebra::Law law = algebra::Law::parse(c.law);
    const int q = law.q();
    SCOPED_TRACE(c.law + " in " + std::to_string(c.in) + " out " + std::to_string(c.out));
    const algebra::GroupWidths widths = algebra::GroupWidths::equal(q, q * c.in, q * c.out);
    const std::vector<int> types = c.interval ? algebra::Schedule::interval(c.M).types(0, c.M, q)
                                              : algebra::Schedule::cyclic().types(0, c.M, q);
    const ops::AlgTwoGroupPlan two = ops::plan_two_group_pass(law, widths, types, c.tile_rows, c.half_cols, 64);
    ASSERT_FALSE(two.plan.tiles.empty()) << two.why_not;
    EXPECT_TRUE(two.why_not.empty());
    const ops::AlgRowPlan& p = two.plan;
    EXPECT_GT(ops::uniform_row_stride(p, c.M), 0);
    for (const ops::AlgRowTile& t : p.tiles) {
      EXPECT_LE(t.row_count, c.tile_rows);
      EXPECT_EQ(t.ncols, 2 * c.out);
      EXPECT_EQ(t.col0 % (2 * c.out), 0) << "a tile starts at an even group";
    }
    for (const ops::AlgSegment& sg : p.segments) EXPECT_EQ(sg.len % 64, 0);
    Rng rng(43);
    const Tensor x = quiver::testing::random_tensor({c.M, widths.K()}, DType::F64, rng);
    const Tensor w = quiver::testing::random_tensor({widths.K(), widths.N()}, DType::F64, rng);
    Tensor ref = Tensor::empty({c.M, widths.N()}, DType::F64);
    ops::algproj_reference_forward(x, w, law, widths, types, ref);
    std::vector<int> writes;
    const Tensor y = run_two_group_plan(p, x, w, writes);
    EXPECT_TRUE(each_once(writes));
    EXPECT_LT(max_abs_diff(y, ref), 1e-9);
    const std::vector<double> cost = algebra::type_costs(law, widths);
    double expected = 0;
    for (int t : types) expected += cost[t];
    EXPECT_EQ(static_cast<double>(p.macs), expected);
  }
}

TEST(AlgProjTiles, TwoGroupPlansSayWhyNot) {
  const std::vector<int> cyclic = algebra::Schedule::cyclic().types(0, 2048, 16);
  auto why = [](const algebra::Law& law, const algebra::GroupWidths& widths, const std::vector<int>& types,
                int half_cols) {
    const ops::AlgTwoGroupPlan p = ops::plan_two_group_pass(law, widths, types, 128, half_cols, 64);
    EXPECT_TRUE(p.plan.tiles.empty());
    return p.why_not;
  };
  const algebra::GroupWidths expert = algebra::GroupWidths::equal(16, 2048, 768);
  EXPECT_NE(why(algebra::Law::dense(16), expert, cyclic, 48).find("at most its own"), std::string::npos);
  EXPECT_NE(why(algebra::Law::parse("graph:4:0>1,1>2,2>3,3>0"), algebra::GroupWidths::equal(4, 512, 192),
                algebra::Schedule::cyclic().types(0, 512, 4), 48)
                .find("at most its own"),
            std::string::npos);
  EXPECT_NE(why(algebra::Law::complete(16), expert, cyclic, 32).find("store box"), std::string::npos);
  EXPECT_NE(why(algebra::Law::complete(16), algebra::GroupWidths::equal(16, 16 * 96, 768), cyclic, 48)
                .find("whole chunks"),
            std::string::npos);
  std::vector<int64_t> out(16, 48);
  out[0] = 40;
  out[1] = 56;
  EXPECT_NE(why(algebra::Law::complete(16), algebra::GroupWidths{std::vector<int64_t>(16, 128), out}, cyclic, 64)
                .find("unequal"),
            std::string::npos);
  std::vector<int> scattered = cyclic;
  std::swap(scattered[0], scattered[17]);  // type 0's rows 1, 16, 32, ...: no progression
  EXPECT_NE(why(algebra::Law::complete(16), expert, scattered, 48).find("progression"), std::string::npos);
  EXPECT_NE(why(algebra::Law::complete(3), algebra::GroupWidths::equal(3, 192, 48), algebra::Schedule::cyclic().types(0, 96, 3), 48)
                .find("odd"),
            std::string::npos);
}

// dX of a cluster plan as the kernels compute it: the row pass's tiles as run_row_plan does, then
// each split tile by its `parts` blocks, block r summing the chunks cluster_piece gives it (the
// tile's segments walked in order, `chunk` deep), and the blocks' sums added in rank order.
Tensor run_cluster_plan(const ops::AlgClusterPlan& cp, const Tensor& dy, const Tensor& w, int64_t out_cols, int chunk,
                        std::vector<int>& writes) {
  Tensor out = run_row_plan(cp.plan, dy, w, true, out_cols, writes);
  const int64_t ld = dy.dim(1), N = w.dim(1);
  const double* DY = dy.data<double>();
  const double* W = w.data<double>();
  for (const ops::AlgRowTile& t : cp.split) {
    std::vector<int32_t> chunk_k0;  // the tile's chunks in order
    for (int32_t s = 0; s < t.seg_count; ++s) {
      const ops::AlgSegment seg = cp.plan.segments[t.seg_begin + s];
      for (int32_t k = seg.k0; k < seg.k0 + seg.len; k += chunk) chunk_k0.push_back(k);
    }
    const int32_t chunks = static_cast<int32_t>(chunk_k0.size());
    for (int32_t r = 0; r < t.row_count; ++r) {
      const int64_t m = cp.plan.rows[t.row_begin + r];
      for (int32_t c = 0; c < t.ncols; ++c) {
        const int64_t col = t.col0 + c;
        double sum = 0;
        for (int32_t rank = 0; rank < cp.parts; ++rank) {
          const ops::AlgChunkRange piece = ops::cluster_piece(chunks, cp.parts, rank);
          double part = 0;
          for (int32_t i = piece.begin; i < piece.end; ++i)
            for (int32_t k = chunk_k0[i]; k < chunk_k0[i] + chunk; ++k) part += DY[m * ld + k] * W[col * N + k];
          sum += part;
        }
        out.data<double>()[m * out_cols + col] = sum;
        ++writes[static_cast<size_t>(m * out_cols + col)];
      }
    }
  }
  return out;
}

TEST(AlgProjTiles, ClusterSplitPiecesCoverTheChunks) {
  for (int32_t parts = 1; parts <= 8; ++parts)
    for (int32_t chunks = 0; chunks <= 70; ++chunks) {
      int32_t next = 0, fewest = chunks, most = 0;
      for (int32_t r = 0; r < parts; ++r) {
        const ops::AlgChunkRange p = ops::cluster_piece(chunks, parts, r);
        EXPECT_EQ(p.begin, next) << chunks << " chunks, " << parts << " parts, rank " << r;
        EXPECT_LE(p.begin, p.end);
        next = p.end;
        fewest = std::min(fewest, p.end - p.begin);
        most = std::max(most, p.end - p.begin);
      }
      EXPECT_EQ(next, chunks);
      EXPECT_LE(most - fewest, 1);
    }
}

// Q_q's dX: a type's own block reduces over all N columns, the others over N / q, so the own
// blocks' tiles (and only those) are split; run as the kernels run them, the plan is the formula,
// every element written once.
TEST(AlgProjTiles, ClusterSplitPlansReproduceTheFormula) {
  struct SplitCase {
    std::string law;
    int64_t K, N, M;
    algebra::Schedule sched;
    int tile_cols, parts, cols;  // the parts and widest split tile expected
  };
  const SplitCase cases[] = {
      // Qwen3-1.7B's shape in miniature (Q_32, own reduction 96 chunks against 3): 8 blocks.
      {"Q32", 2048, 6144, 96, algebra::Schedule::cyclic(), 64, 8, 64},
      // Q_16 (32 chunks against 2), 128 rows a type cut into tiles of 64, interval rows.
      {"Q16", 512, 2048, 2048, algebra::Schedule::interval(2048), 64, 8, 32},
      // Q_4 (8 chunks against 2): 2 blocks; tiles of 128 columns over blocks of 80.
      {"Q4", 320, 512, 260, algebra::Schedule::cyclic(), 128, 2, 80},
      // Blocks of 160 (Qwen3-32B's) planned as 64 + 64 + 32, merged into one split tile.
      {"Q8", 1280, 1024, 64, algebra::Schedule::cyclic(), 64, 4, 160},
      // Blocks of 448 (DeepSeek-V3's) in tiles of 128: merged up to 192 columns, 128 + 128 + 192.
      {"Q4", 1792, 512, 8, algebra::Schedule::cyclic(), 128, 2, 192},
  };
  for (const SplitCase& c : cases) {
    SCOPED_TRACE(c.law + " K " + std::to_string(c.K) + " N " + std::to_string(c.N));
    const algebra::Law law = algebra::Law::parse(c.law);
    const int q = law.q();
    const algebra::GroupWidths widths = algebra::GroupWidths::equal(q, c.K, c.N);
    const std::vector<int> types = c.sched.types(0, c.M, q);
    const ops::AlgRowPlan whole = ops::plan_row_pass(law, widths, types, ops::AlgPass::DX, 64, c.tile_cols, false);
    const ops::AlgClusterPlan cp = ops::plan_cluster_split(whole, 64, 64, 192, 8);
    EXPECT_EQ(cp.parts, c.parts);
    EXPECT_EQ(cp.cols, c.cols);
    ASSERT_FALSE(cp.split.empty());
    EXPECT_EQ(cp.plan.rows, whole.rows);
    EXPECT_EQ(cp.plan.macs, whole.macs);
    // The split tiles are exactly the own blocks' (output group = the rows' type), whole chunks,
    // each block's tiles merged up to 192 columns.
    const int64_t block = c.K / q;
    std::map<int32_t, int64_t> block_cols;  // split columns of each row tile
    for (const ops::AlgRowTile& t : cp.split) {
      const int type = types[cp.plan.rows[t.row_begin]];
      EXPECT_EQ(t.col0 / block, type);
      EXPECT_EQ((t.col0 + t.ncols - 1) / block, type);
      EXPECT_LE(t.row_count, 64);
      EXPECT_LE(t.ncols, 192);
      block_cols[t.row_begin] += t.ncols;
      int64_t len = 0;
      for (int32_t s = 0; s < t.seg_count; ++s) len += cp.plan.segments[t.seg_begin + s].len;
      EXPECT_EQ(len, c.N);
    }
    for (const auto& [row_begin, cols] : block_cols) EXPECT_EQ(cols, block);
    for (const ops::AlgRowTile& t : cp.plan.tiles) EXPECT_NE(t.col0 / block, types[cp.plan.rows[t.row_begin]]);
    // The row pass keeps its tiles' order (longest first).
    std::vector<ops::AlgRowTile> kept;
    for (const ops::AlgRowTile& t : whole.tiles)
      if (std::none_of(cp.split.begin(), cp.split.end(), [&](const ops::AlgRowTile& s) {
            return s.row_begin == t.row_begin && s.col0 <= t.col0 && t.col0 < s.col0 + s.ncols;
          }))
        kept.push_back(t);
    ASSERT_EQ(kept.size(), cp.plan.tiles.size());
    for (size_t i = 0; i < kept.size(); ++i)
      EXPECT_TRUE(kept[i].row_begin == cp.plan.tiles[i].row_begin && kept[i].col0 == cp.plan.tiles[i].col0);

    Rng rng(47);
    const Tensor dy = quiver::testing::random_tensor({c.M, c.N}, DType::F64, rng);
    const Tensor w = quiver::testing::random_tensor({c.K, c.N}, DType::F64, rng);
    const Tensor x = quiver::testing::random_tensor({c.M, c.K}, DType::F64, rng);
    Tensor dx_ref = Tensor::empty({c.M, c.K}, DType::F64), dw_ref = Tensor::empty({c.K, c.N}, DType::F64);
    ops::algproj_reference_backward(x, w, dy, law, widths, types, dx_ref, dw_ref);
    std::vector<int> writes;
    const Tensor dx = run_cluster_plan(cp, dy, w, c.K, 64, writes);
    EXPECT_TRUE(each_once(writes));
    EXPECT_LT(max_abs_diff(dx, dx_ref), 1e-9);
  }
}

// Nothing is split where no tile is long (Q_q's forward), where the long tiles' segments are not
// whole chunks (dX over output groups of 200), or where their tiles have more rows than a block
// takes.
TEST(AlgProjTiles, ClusterSplitOnlyWholeChunksOfLongTiles) {
  const algebra::Law q4 = algebra::Law::complete(4);
  const std::vector<int> types = algebra::Schedule::cyclic().types(0, 256, 4);
  auto split = [&](const algebra::GroupWidths& widths, ops::AlgPass pass, int tile_rows, int max_rows) {
    const ops::AlgRowPlan whole = ops::plan_row_pass(q4, widths, types, pass, tile_rows, 64, false);
    const ops::AlgClusterPlan cp = ops::plan_cluster_split(whole, 64, max_rows, 192, 8);
    EXPECT_EQ(cp.plan.tiles.size() + cp.split.size(), whole.tiles.size());  // 64-column tiles of 64-column blocks
    return cp;
  };
  const algebra::GroupWidths even = algebra::GroupWidths::equal(4, 256, 1024);
  EXPECT_EQ(split(even, ops::AlgPass::Forward, 64, 64).parts, 0);
  EXPECT_EQ(split(algebra::GroupWidths::equal(4, 256, 800), ops::AlgPass::DX, 64, 64).parts, 0);
  EXPECT_EQ(split(even, ops::AlgPass::DX, 64, 32).parts, 0);
  const ops::AlgClusterPlan cp = split(even, ops::AlgPass::DX, 64, 64);
  EXPECT_EQ(cp.parts, 2);  // 16 chunks against the others' 4
  EXPECT_EQ(cp.split.size(), 4u);
  EXPECT_THROW(ops::plan_cluster_split(ops::AlgRowPlan{}, 64, 64, 192, 1), Error);
  // A plan with split reductions of its own (Q_16's dX, pieces of 512).
  const ops::AlgRowPlan pieces = ops::plan_row_pass(algebra::Law::complete(16), algebra::GroupWidths::equal(16, 512, 2048),
                                                    algebra::Schedule::cyclic().types(0, 32, 16), ops::AlgPass::DX, 2, 8);
  ASSERT_FALSE(pieces.splits.empty());
  EXPECT_THROW(ops::plan_cluster_split(pieces, 64, 64, 192, 8), Error);
}

// The TMA weight pass's chunks: each a progression of step 1 or the stride, at most 64 rows,
// together exactly each tile's rows; cyclic types cut along one type's stride, interval types
// along their runs, a multi-type list of cyclic types per type; random types refused.
TEST(AlgProjTiles, WeightChunksCoverEachTileOnce) {
  const algebra::Law law = algebra::Law::parse("Q2xQ2");
  const algebra::GroupWidths widths = algebra::GroupWidths::equal(4, 32, 32);
  auto check = [&](const std::vector<int>& types, int stride, int64_t min_pieces) -> double {
    const ops::AlgWeightPlan p = ops::plan_weight_pass(law, widths, types, 8, 8, true, min_pieces);
    const ops::AlgWeightChunks c = ops::plan_weight_chunks(p, types, stride);
    EXPECT_EQ(c.stride, stride);
    if (c.tile_begin.size() != p.tiles.size() + 1) {
      ADD_FAILURE() << "tile_begin has " << c.tile_begin.size() << " entries for " << p.tiles.size() << " tiles";
      return 0;
    }
    int64_t rows = 0;
    for (size_t t = 0; t < p.tiles.size(); ++t) {
      std::vector<int32_t> got;
      for (int32_t i = c.tile_begin[t]; i < c.tile_begin[t + 1]; ++i) {
        const ops::AlgWeightChunk& ch = c.chunks[i];
        EXPECT_GE(ch.count, 1);
        EXPECT_LE(ch.count, ops::kAlgTmaChunkRows);
        for (int r = 0; r < ch.count; ++r) got.push_back(ch.row0 + r * (ch.strided ? stride : 1));
      }
      std::vector<int32_t> want(p.rows.begin() + p.tiles[t].list_begin,
                                p.rows.begin() + p.tiles[t].list_begin + p.tiles[t].list_count);
      std::sort(got.begin(), got.end());
      EXPECT_EQ(got, want) << "tile " << t;
      rows += p.tiles[t].list_count;
    }
    return static_cast<double>(rows) / (static_cast<double>(c.chunks.size()) * ops::kAlgTmaChunkRows);
  };
  const double cyclic_fill = check(algebra::Schedule::cyclic().types(0, 4096, 4), 4, 64);
  EXPECT_GT(cyclic_fill, 0.9);  // pieces of mixed lists end mid-chunk
  const double interval_fill = check(algebra::Schedule::interval(768).types(0, 3072, 4), 4, 0);
  EXPECT_GT(interval_fill, 0.99);  // runs of 768 rows
  check(algebra::Schedule::cyclic().types(0, 260, 4), 4, 0);  // partial chunks at the ends
  // One row, or random types (runs of one row): chunks of one row, refused; strided chunks with
  // M not a multiple of the stride: refused.
  EXPECT_EQ(ops::plan_weight_chunks(ops::plan_weight_pass(law, widths, {2}, 8, 8, false), {2}, 4).stride, 0);
  std::vector<int> random(4096);
  Rng rng(10);
  for (int& t : random) t = static_cast<int>(rng.below(4));
  const ops::AlgWeightPlan p = ops::plan_weight_pass(law, widths, random, 8, 8, false);
  EXPECT_EQ(ops::plan_weight_chunks(p, random, 4).stride, 0);
  const std::vector<int> odd = algebra::Schedule::cyclic().types(0, 261, 4);
  EXPECT_EQ(ops::plan_weight_chunks(ops::plan_weight_pass(law, widths, odd, 8, 8, false), odd, 4).stride, 0);
  // Tiles from a column that is not a multiple of 8 (groups of 20): refused.
  const std::vector<int> cyc = algebra::Schedule::cyclic().types(0, 256, 4);
  const ops::AlgWeightPlan narrow = ops::plan_weight_pass(law, algebra::GroupWidths::equal(4, 80, 32), cyc, 8, 8, false);
  EXPECT_EQ(ops::plan_weight_chunks(narrow, cyc, 4).stride, 0);
}

TEST(AlgProjTiles, BadArgumentsNameTheProblem) {
  const algebra::Law q4 = algebra::Law::complete(4);
  const algebra::GroupWidths w = algebra::GroupWidths::equal(4, 16, 16);
  EXPECT_THROW(ops::plan_row_pass(q4, w, {0, 5}, ops::AlgPass::Forward, 8, 8), Error);
  EXPECT_THROW(ops::plan_row_pass(q4, w, {0}, ops::AlgPass::DW, 8, 8), Error);
  EXPECT_THROW(ops::plan_weight_pass(q4, w, {0}, 0, 8), Error);
}

}  // namespace

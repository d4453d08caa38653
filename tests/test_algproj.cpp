#include <gtest/gtest.h>

#include "algebra/law.h"
#include "ops/algproj.h"
#include "testing.h"

using namespace quiver;
using namespace quiver::algebra;
using quiver::ops::AlgProj;
namespace qt = quiver::testing;

namespace {

GroupWidths random_widths(int q, Rng& rng, int64_t lo = 1, int64_t hi = 7) {
  GroupWidths w;
  for (int i = 0; i < q; ++i) {
    w.in.push_back(lo + static_cast<int64_t>(rng.below(hi - lo + 1)));
    w.out.push_back(lo + static_cast<int64_t>(rng.below(hi - lo + 1)));
  }
  return w;
}

std::vector<int> random_types(int64_t M, int q, Rng& rng) {
  std::vector<int> t(M);
  for (auto& v : t) v = static_cast<int>(rng.below(q));
  return t;
}

// Compares the fast path with the masked-dense reference in F64 for one configuration.
void expect_matches_reference(const Law& law, const GroupWidths& w, const std::vector<int>& types,
                              Rng& rng, const std::string& what) {
  const int64_t M = static_cast<int64_t>(types.size()), K = w.K(), N = w.N();
  Tensor x = qt::random_tensor({M, K}, DType::F64, rng);
  Tensor wt = qt::random_tensor({K, N}, DType::F64, rng);
  Tensor dy = qt::random_tensor({M, N}, DType::F64, rng);
  Tensor y_ref = Tensor::empty({M, N}, DType::F64);
  Tensor dx_ref = Tensor::empty({M, K}, DType::F64), dw_ref = Tensor::empty({K, N}, DType::F64);
  ops::algproj_reference_forward(x, wt, law, w, types, y_ref);
  ops::algproj_reference_backward(x, wt, dy, law, w, types, dx_ref, dw_ref);
  for (ops::RowAccess access : {ops::RowAccess::InPlace, ops::RowAccess::Gather}) {
    AlgProj proj(law, w, access);
    std::string how =
        what + (access == ops::RowAccess::Gather ? " (gathered rows)" : " (rows in place)");
    Tensor y = qt::poisoned({M, N}, DType::F64);
    proj.forward(x, wt, types, y);
    EXPECT_LT(rel_error(y, y_ref), 1e-13) << how << " forward";
    Tensor dx = qt::poisoned({M, K}, DType::F64), dw = qt::poisoned({K, N}, DType::F64);
    proj.backward(x, wt, dy, types, &dx, &dw);
    EXPECT_LT(rel_error(dx, dx_ref), 1e-13) << how << " dx";
    EXPECT_LT(rel_error(dw, dw_ref), 1e-13) << how << " dw";
  }
}

}  // namespace

TEST(AlgProj, MatchesMaskedDenseForEveryLawKindAndSchedule) {
  Rng rng(5);
  const char* laws[] = {"dense",
                        "dense:3",
                        "Q2",
                        "Q4",
                        "Q5",
                        "blockdiag:4",
                        "graph:4:0>1,1>2,2>3",
                        "graph:5:0>4,3>1,2>0",
                        "Q2xQ2",
                        "Q2xQ2xQ2",
                        "graph:3:0>2xQ2",
                        "Q3xblockdiag:2"};
  for (const char* spec : laws) {
    Law law = Law::parse(spec);
    int q = law.q();
    for (int trial = 0; trial < 2; ++trial) {
      GroupWidths w = random_widths(q, rng);
      int64_t M = 3 * q + static_cast<int64_t>(rng.below(11));
      expect_matches_reference(law, w, Schedule::cyclic().types(0, M, q), rng,
                               std::string(spec) + " cyclic");
      expect_matches_reference(law, w, Schedule::interval(2 * q).types(3, M, q), rng,
                               std::string(spec) + " interval");
      expect_matches_reference(law, w, random_types(M, q, rng), rng,
                               std::string(spec) + " random rows");
    }
  }
}

TEST(AlgProj, DenseLawIsPlainMatmul) {
  Rng rng(6);
  Tensor x = qt::random_tensor({9, 12}, DType::F64, rng),
         w = qt::random_tensor({12, 10}, DType::F64, rng);
  AlgProj proj(Law::parse("dense:2"), GroupWidths{{5, 7}, {4, 6}});
  Tensor y = Tensor::empty({9, 10}, DType::F64);
  proj.forward(x, w, random_types(9, 2, rng), y);
  Tensor ref = Tensor::zeros({9, 10}, DType::F64);
  for (int m = 0; m < 9; ++m)
    for (int n = 0; n < 10; ++n)
      for (int k = 0; k < 12; ++k) ref.data<double>()[m * 10 + n] += x.at({m, k}) * w.at({k, n});
  EXPECT_LT(rel_error(y, ref), 1e-14);
  EXPECT_EQ(proj.shared_products(), 1u) << "the dense law runs as a single GEMM";
}

TEST(AlgProj, DecodeOfFewRowsMatchesFullForward) {
  Rng rng(7);
  Law law = Law::parse("Q2xQ2");
  GroupWidths w = random_widths(4, rng, 2, 6);
  AlgProj proj(law, w);
  Schedule sched = Schedule::interval(8);
  const int64_t T = 20;
  Tensor x = qt::random_tensor({T, w.K()}, DType::F64, rng),
         wt = qt::random_tensor({w.K(), w.N()}, DType::F64, rng);
  Tensor y = Tensor::empty({T, w.N()}, DType::F64);
  proj.forward(x, wt, sched.types(0, T, 4), y);
  for (int64_t p = 0; p < T; ++p) {  // one row at a time, as in decoding
    Tensor yp = qt::poisoned({1, w.N()}, DType::F64);
    proj.forward(x.slice(0, p, p + 1), wt, sched.types(p, 1, 4), yp);
    EXPECT_LT(rel_error(yp, y.slice(0, p, p + 1)), 1e-14) << "position " << p;
  }
  // A few rows of mixed types at once.
  std::vector<int64_t> picks = {3, 17, 6, 12};
  Tensor xs = Tensor::empty({4, w.K()}, DType::F64), ys = qt::poisoned({4, w.N()}, DType::F64);
  std::vector<int> types;
  for (int i = 0; i < 4; ++i) {
    xs.slice(0, i, i + 1).copy_from(x.slice(0, picks[i], picks[i] + 1));
    types.push_back(sched.type_of(picks[i], 4));
  }
  proj.forward(xs, wt, types, ys);
  for (int i = 0; i < 4; ++i)
    EXPECT_LT(rel_error(ys.slice(0, i, i + 1), y.slice(0, picks[i], picks[i] + 1)), 1e-14);
}

TEST(AlgProj, DecodeReadsOnlyTheBlocksOfItsType) {
  Law law = Law::parse("Q4");
  GroupWidths w = GroupWidths::equal(4, 64, 32);
  AlgProj proj(law, w);
  for (int a = 0; a < 4; ++a) {
    // Diagonal blocks plus the source row of off-diagonal blocks: C_i of SPEC §1.2.
    int64_t expected = 4 * 16 * 8 + 16 * (32 - 8);
    EXPECT_EQ(proj.weight_elements_read(a), expected);
  }
}

TEST(AlgProj, GradientsMatchFiniteDifferences) {
  Rng rng(8);
  Law law = Law::parse("graph:3:0>1,2>0");
  GroupWidths w{{2, 3, 1}, {3, 1, 2}};
  AlgProj proj(law, w);
  std::vector<int> types = {0, 2, 1, 1, 0};
  Tensor x = qt::random_tensor({5, 6}, DType::F64, rng),
         wt = qt::random_tensor({6, 6}, DType::F64, rng);
  Tensor dy = qt::random_tensor({5, 6}, DType::F64, rng);
  auto loss = [&] {
    Tensor y = Tensor::empty({5, 6}, DType::F64);
    proj.forward(x, wt, types, y);
    return qt::dot(y, dy);
  };
  Tensor dx = Tensor::empty({5, 6}, DType::F64), dw = Tensor::empty({6, 6}, DType::F64);
  proj.backward(x, wt, dy, types, &dx, &dw);
  EXPECT_LT(qt::finite_difference_error(loss, x, dx), 1e-8);
  EXPECT_LT(qt::finite_difference_error(loss, wt, dw), 1e-8);
}

TEST(AlgProj, Float32AgreesWithFloat64) {
  Rng rng(9);
  Law law = Law::parse("Q4");
  GroupWidths w = GroupWidths::equal(4, 64, 48);
  AlgProj proj(law, w);
  std::vector<int> types = Schedule::cyclic().types(0, 37, 4);
  Tensor x = qt::random_tensor({37, 64}, DType::F64, rng),
         wt = qt::random_tensor({64, 48}, DType::F64, rng);
  Tensor y64 = Tensor::empty({37, 48}, DType::F64), y32 = Tensor::empty({37, 48}, DType::F32);
  proj.forward(x, wt, types, y64);
  proj.forward(x.to(DType::F32), wt.to(DType::F32), types, y32);
  // Inputs rounded to f32 (2^-24 relative) and ~K/q·2 accumulated terms: well under 1e-5.
  EXPECT_LT(rel_error(y32, y64), 1e-5);
}

TEST(AlgProj, BadInputNamesTheProblem) {
  Law law = Law::parse("Q2");
  AlgProj proj(law, GroupWidths::equal(2, 4, 6));
  Tensor x = Tensor::zeros({3, 4}, DType::F32), w = Tensor::zeros({4, 6}, DType::F32);
  Tensor y = Tensor::zeros({3, 6}, DType::F32);
  auto message = [](auto&& fn) {
    try {
      fn();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([&] {
              proj.forward(Tensor::zeros({3, 5}, DType::F32), w, {0, 1, 0}, y);
            }).find("x:"),
            std::string::npos);
  EXPECT_NE(message([&] {
              proj.forward(x, Tensor::zeros({4, 7}, DType::F32), {0, 1, 0}, y);
            }).find("w:"),
            std::string::npos);
  EXPECT_NE(message([&] { proj.forward(x, w, {0, 1}, y); }).find("row_types"), std::string::npos);
  EXPECT_NE(message([&] { proj.forward(x, w, {0, 2, 0}, y); }).find("type 2"), std::string::npos);
  EXPECT_NE(message([&] {
              proj.forward(x, w.to(DType::F64), {0, 1, 0}, y);
            }).find("F64"),
            std::string::npos);
  EXPECT_THROW(AlgProj(law, GroupWidths{{4}, {6}}), Error);
}

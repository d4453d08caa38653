#include <gtest/gtest.h>

#include "algebra/law.h"
#include "quiver/rng.h"
#include "testing.h"

using namespace quiver;
using namespace quiver::algebra;

namespace {
GroupWidths equal(int q, int64_t width = 1) { return GroupWidths::equal(q, q * width, q * width); }
}  // namespace

TEST(Law, CompleteGraphFactsMatchClosedForms) {
  for (int q : {1, 2, 3, 4, 8, 16}) {
    Law law = Law::parse("Q" + std::to_string(q));
    Facts f = facts(law, equal(q, 3));
    EXPECT_EQ(f.q, q);
    EXPECT_EQ(f.dim, static_cast<int64_t>(q) * q) << "Q_q has q vertices and q(q-1) edges";
    ASSERT_TRUE(f.rank.has_value());
    EXPECT_EQ(*f.rank, 2 * q * q - q);
    EXPECT_EQ(f.products, 2 * q * q - q);
    EXPECT_EQ(*f.rank_lower_bound, 2 * q * q - q) << "Alder–Strassen is tight for graph laws";
    EXPECT_NEAR(f.rho, (2.0 * q - 1) / (q * q), 1e-15);
    EXPECT_TRUE(f.associative);
    EXPECT_TRUE(f.unital);
  }
}

TEST(Law, GraphLawRankIsVerticesPlusTwiceEdges) {
  Law law = Law::parse("graph:4:0>1,1>2,2>3");
  Facts f = facts(law, equal(4, 2));
  EXPECT_EQ(f.dim, 4 + 3);
  EXPECT_EQ(*f.rank, 4 + 2 * 3);
  EXPECT_EQ(f.products, 4 + 2 * 3);
  EXPECT_EQ(*f.rank_lower_bound, 2 * 7 - 4);
  EXPECT_TRUE(f.associative && f.unital);
  // Random graphs.
  Rng rng(3);
  for (int trial = 0; trial < 10; ++trial) {
    int q = 2 + static_cast<int>(rng.below(6));
    std::vector<std::pair<int, int>> edges;
    for (int a = 0; a < q; ++a)
      for (int b = 0; b < q; ++b)
        if (a != b && rng.uniform() < 0.4) edges.emplace_back(a, b);
    Law g = Law::graph(q, edges);
    Facts gf = facts(g, equal(q));
    EXPECT_EQ(*gf.rank, q + 2 * static_cast<int64_t>(edges.size()));
    EXPECT_EQ(*gf.rank_lower_bound, *gf.rank);
    EXPECT_TRUE(gf.associative && gf.unital) << g.name();
  }
}

TEST(Law, GraphSupportFollowsTheSpec) {
  Law law = Law::parse("graph:3:0>1");
  EXPECT_EQ(law.support(0, 0), std::vector<int>({0}));
  EXPECT_EQ(law.support(0, 1), std::vector<int>({0, 1}));  // edge 0→1
  EXPECT_EQ(law.support(1, 0), std::vector<int>({0}));     // no edge 1→0: diagonal only
  EXPECT_EQ(law.support(0, 2), std::vector<int>({2}));
}

TEST(Law, TensorPowersOfQ2) {
  for (int L = 1; L <= 3; ++L) {
    std::string spec = "Q2";
    for (int i = 1; i < L; ++i) spec += "xQ2";
    Law law = Law::parse(spec);
    int q = 1 << L;
    EXPECT_EQ(law.q(), q);
    Facts f = facts(law, equal(q, 2));
    EXPECT_NEAR(f.rho, std::pow(0.75, L), 1e-15);
    int64_t products = 1, dim = 1;
    for (int i = 0; i < L; ++i) products *= 6, dim *= 4;
    EXPECT_EQ(f.products, products);
    EXPECT_EQ(f.dim, dim);
    EXPECT_EQ(*f.rank_lower_bound, 2 * dim - q);
    if (L == 1)
      EXPECT_EQ(*f.rank, 6);
    else
      EXPECT_FALSE(f.rank.has_value()) << "the exact rank of Q2^{⊗L} is not known";
    EXPECT_TRUE(f.associative && f.unital);
  }
  // Q2⊗Q2: 36 products, rank in [28, 36] (SPEC §1.2).
  Facts f = facts(Law::parse("Q2xQ2"), equal(4));
  EXPECT_EQ(f.products, 36);
  EXPECT_EQ(*f.rank_lower_bound, 28);
}

TEST(Law, TensorSupportIsTheProductOfFactorSupports) {
  Law a = Law::parse("graph:3:0>2"), b = Law::parse("Q2");
  Law t = Law::tensor(a, b);
  for (int ga = 0; ga < 3; ++ga)
    for (int gb = 0; gb < 2; ++gb)
      for (int da = 0; da < 3; ++da)
        for (int db = 0; db < 2; ++db)
          for (int ba = 0; ba < 3; ++ba)
            for (int bb = 0; bb < 2; ++bb)
              EXPECT_EQ(t.contributes(ga * 2 + gb, ba * 2 + bb, da * 2 + db),
                        a.contributes(ga, ba, da) && b.contributes(gb, bb, db));
  Facts f = facts(t, equal(6));
  EXPECT_TRUE(f.associative && f.unital);
  EXPECT_EQ(f.products, (3 + 2) * 6);
}

TEST(Law, DenseAndBlockDiagonal) {
  Facts d1 = facts(Law::parse("dense"), equal(1, 5));
  EXPECT_EQ(d1.dim, 1);
  EXPECT_EQ(*d1.rank, 1);
  EXPECT_DOUBLE_EQ(d1.rho, 1.0);
  Facts d3 = facts(Law::parse("dense:3"), equal(3));
  EXPECT_EQ(d3.dim, 9);
  EXPECT_EQ(d3.products, 27);
  EXPECT_EQ(*d3.rank_lower_bound, 2 * 9 - 1);
  EXPECT_FALSE(d3.rank.has_value());
  EXPECT_DOUBLE_EQ(d3.rho, 1.0);
  EXPECT_TRUE(d3.associative && d3.unital);
  EXPECT_EQ(*facts(Law::parse("dense:2"), equal(2)).rank, 7);
  Facts bd = facts(Law::parse("blockdiag:4"), equal(4));
  EXPECT_EQ(bd.dim, 4);
  EXPECT_EQ(*bd.rank, 4);
  EXPECT_DOUBLE_EQ(bd.rho, 0.25);
}

TEST(Law, UnequalWidthsCostAndRho) {
  Law law = Law::parse("Q3");
  GroupWidths w{{2, 5, 1}, {4, 3, 7}};
  Facts f = facts(law, w);
  double diag = 2 * 4 + 5 * 3 + 1 * 7;
  for (int i = 0; i < 3; ++i) EXPECT_DOUBLE_EQ(f.type_cost[i], diag + w.in[i] * (w.N() - w.out[i]));
  double mean = (f.type_cost[0] + f.type_cost[1] + f.type_cost[2]) / 3;
  EXPECT_DOUBLE_EQ(f.rho, mean / (w.K() * w.N()));
}

TEST(Law, VerifierDetectsNonAssociativeTables) {
  // dense:2 with x_1 W_11 dropped from B(0, 1): ((xy)z)_01 and (x(yz))_01 differ by
  // x_01 y_10 z_01, and the block identity is no longer a right unit.
  std::vector<std::vector<int>> table = {{0, 1}, {0}, {0, 1}, {0, 1}};
  Facts f = facts(Law::from_table(2, table, "broken"), equal(2));
  EXPECT_FALSE(f.associative);
  EXPECT_GT(f.associativity_error, 1e-3);
  EXPECT_FALSE(f.unital);
  EXPECT_FALSE(f.rank.has_value());
  EXPECT_FALSE(f.rank_lower_bound.has_value());
  Facts ok = facts(Law::from_table(2, {{0, 1}, {0, 1}, {0, 1}, {0, 1}}), equal(2));
  EXPECT_TRUE(ok.associative && ok.unital) << "the dense table written out is M_2";
  EXPECT_THROW(Law::from_table(2, {{0}, {2}, {0}, {1}}), Error);
}

TEST(Law, ParseErrorsNameTheProblem) {
  auto message = [](const std::string& spec) {
    try {
      Law::parse(spec);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("Z4").find("unknown law"), std::string::npos);
  EXPECT_NE(message("Qz").find("not a number"), std::string::npos);
  EXPECT_NE(message("graph:3:0>3").find("outside"), std::string::npos);
  EXPECT_NE(message("graph:3:1>1").find("self-loop"), std::string::npos);
  EXPECT_NE(message("graph:3:0-1").find("a>b"), std::string::npos);
  EXPECT_NE(message("Q0").find("groups"), std::string::npos);
  EXPECT_NE(message("").find("empty"), std::string::npos);
}

TEST(Widths, ValidationNamesTheProblem) {
  GroupWidths w{{2, 2}, {3, 3}};
  EXPECT_NO_THROW(w.validate(2, 4, 6));
  EXPECT_THROW(w.validate(3), Error);
  try {
    w.validate(2, 5, 6);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sum to 4"), std::string::npos);
  }
  EXPECT_THROW(GroupWidths::equal(3, 10, 9), Error);
  EXPECT_THROW(parse_widths("3,x,4", "--in-groups"), Error);
  EXPECT_THROW(parse_widths("3,0", "--in-groups"), Error);
  EXPECT_EQ(parse_widths("3,1,4", "--in-groups"), (std::vector<int64_t>{3, 1, 4}));
}

TEST(Schedule, IntervalCyclicAndTable) {
  Schedule iv = Schedule::parse("interval:768");
  EXPECT_EQ(iv.type_of(0, 4), 0);
  EXPECT_EQ(iv.type_of(191, 4), 0);
  EXPECT_EQ(iv.type_of(192, 4), 1);
  EXPECT_EQ(iv.type_of(767, 4), 3);
  EXPECT_EQ(iv.type_of(768 + 400, 4), 2);
  EXPECT_THROW(Schedule::parse("interval:10").validate(4), Error);
  Schedule cy = Schedule::parse("cyclic");
  for (int p = 0; p < 20; ++p) EXPECT_EQ(cy.type_of(p, 3), p % 3);
  Schedule tb = Schedule::parse("table:2,0,1");
  EXPECT_EQ(tb.types(4, 3, 3), (std::vector<int>{0, 1, 2}));
  EXPECT_THROW(tb.validate(2), Error);
  EXPECT_THROW(Schedule::parse("sometimes"), Error);
  // Positions restart per sequence in a batch.
  EXPECT_EQ(cy.batch_types(2, 3, 1, 2), (std::vector<int>{1, 0, 1, 1, 0, 1}));
}

TEST(Star, CompositionIdentityAndUnit) {
  Rng rng(11);
  for (const char* spec :
       {"Q4", "graph:4:0>1,1>2,2>3,3>0", "Q2xQ2", "blockdiag:3", "dense:2", "graph:3:0>2xQ2"}) {
    Law law = Law::parse(spec);
    int q = law.q();
    int64_t b = 3, n = q * b;
    GroupWidths w = GroupWidths::equal(q, n, n);
    Tensor w1 = quiver::testing::random_tensor({n, n}, DType::F64, rng);
    Tensor w2 = quiver::testing::random_tensor({n, n}, DType::F64, rng);
    Tensor w12 = star(w1, w2, law, w, w);
    // Φ_{W2}(Φ_{W1}(x)) = Φ_{W1⋆W2}(x) for every row type, evaluated with masked blocks.
    for (int a = 0; a < q; ++a) {
      Tensor x = quiver::testing::random_tensor({1, n}, DType::F64, rng);
      auto apply = [&](const Tensor& in, const Tensor& W) {
        Tensor out = Tensor::zeros({1, n}, DType::F64);
        for (int d = 0; d < q; ++d)
          for (int be : law.support(a, d))
            for (int64_t i = 0; i < b; ++i)
              for (int64_t j = 0; j < b; ++j)
                out.data<double>()[d * b + j] +=
                    in.data<double>()[be * b + i] * W.data<double>()[(be * b + i) * n + d * b + j];
        return out;
      };
      EXPECT_LT(rel_error(apply(apply(x, w1), w2), apply(x, w12)), 1e-13) << spec << " type " << a;
    }
    // The block identity is a two-sided unit on the algebra's slots (α, δ) with
    // α ∈ B(α, δ); the other blocks of a bank are never read by any row type.
    Tensor e = Tensor::zeros({n, n}, DType::F64);
    for (int64_t i = 0; i < n; ++i) e.data<double>()[i * n + i] = 1.0;
    auto on_slots = [&](const Tensor& t) {
      Tensor o = t.clone();
      for (int a = 0; a < q; ++a)
        for (int d = 0; d < q; ++d)
          if (!law.contributes(a, a, d))
            for (int64_t i = 0; i < b; ++i)
              for (int64_t j = 0; j < b; ++j) o.data<double>()[(a * b + i) * n + d * b + j] = 0;
      return o;
    };
    EXPECT_LT(rel_error(on_slots(star(e, w1, law, w, w)), on_slots(w1)), 1e-15) << spec;
    EXPECT_LT(rel_error(on_slots(star(w1, e, law, w, w)), on_slots(w1)), 1e-15) << spec;
  }
}

// `quiver algebra` and `quiver op algproj` end to end through the built binary.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "algebra/law.h"
#include "ops/algproj.h"
#include "quiver/safetensors.h"
#include "testing.h"

using namespace quiver;
namespace qt = quiver::testing;

TEST(AlgebraCli, JsonFactsMatchTheLibrary) {
  qt::ScratchDir dir("algebra_cli_json");
  for (const char* spec :
       {"Q4", "Q2xQ2", "graph:4:0>1,1>2,2>3", "blockdiag:4", "dense", "Q2xQ2xQ2"}) {
    qt::CliResult r = qt::run_cli(fmt::format("algebra '{}' --json", spec), dir);
    ASSERT_EQ(r.status, 0) << spec << ": " << r.err;
    nlohmann::json j = nlohmann::json::parse(r.out);
    algebra::Law law = algebra::Law::parse(spec);
    algebra::Facts f = algebra::facts(law, algebra::GroupWidths::equal(law.q(), law.q(), law.q()));
    EXPECT_EQ(j.at("q").get<int>(), f.q) << spec;
    EXPECT_EQ(j.at("dim").get<int64_t>(), f.dim) << spec;
    EXPECT_EQ(j.at("products").get<int64_t>(), f.products) << spec;
    EXPECT_EQ(j.at("rank").is_null(), !f.rank.has_value()) << spec;
    if (f.rank) EXPECT_EQ(j.at("rank").get<int64_t>(), *f.rank) << spec;
    EXPECT_EQ(j.at("rank_lower_bound").get<int64_t>(), *f.rank_lower_bound) << spec;
    EXPECT_DOUBLE_EQ(j.at("rho").get<double>(), f.rho) << spec;
    EXPECT_TRUE(j.at("associative").get<bool>()) << spec;
    EXPECT_TRUE(j.at("unital").get<bool>()) << spec;
  }
  // Widths change ρ; the text form prints the table and the verification.
  qt::CliResult r = qt::run_cli("algebra Q2 --in-groups 1,3 --out-groups 2,2 --json", dir);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_DOUBLE_EQ(nlohmann::json::parse(r.out).at("rho").get<double>(),
                   algebra::arithmetic_fraction(algebra::Law::parse("Q2"),
                                                algebra::GroupWidths{{1, 3}, {2, 2}}));
  r = qt::run_cli("algebra Q4", dir);
  ASSERT_EQ(r.status, 0);
  EXPECT_NE(r.out.find("associative"), std::string::npos);
  EXPECT_NE(r.out.find("0,3"), std::string::npos) << "support table printed";
}

TEST(AlgebraCli, BadInputExitsNonZeroNamingTheProblem) {
  qt::ScratchDir dir("algebra_cli_bad");
  qt::CliResult r = qt::run_cli("algebra Z3", dir);
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("unknown law 'Z3'"), std::string::npos) << r.err;
  r = qt::run_cli("algebra Q4 --in-groups 1,2,3", dir);
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("4 groups, got 3 widths"), std::string::npos) << r.err;
  r = qt::run_cli("algebra 'graph:3:0>5'", dir);
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("outside"), std::string::npos) << r.err;
}

namespace {
struct AlgProjFiles {
  Tensor x, w, dy;
};
AlgProjFiles write_inputs(const std::string& path, int64_t M, int64_t K, int64_t N, DType dtype,
                          bool with_dy) {
  Rng rng(21);
  AlgProjFiles f{qt::random_tensor({M, K}, dtype, rng), qt::random_tensor({K, N}, dtype, rng),
                 qt::random_tensor({M, N}, dtype, rng)};
  std::map<std::string, Tensor> t{{"x", f.x}, {"w", f.w}};
  if (with_dy) t["dy"] = f.dy;
  write_safetensors(path, t);
  return f;
}
}  // namespace

TEST(AlgProjCli, OutputsMatchTheMaskedDenseReference) {
  qt::ScratchDir dir("algproj_cli");
  for (DType dtype : {DType::F64, DType::F32}) {
    AlgProjFiles in = write_inputs(dir.file("in.safetensors"), 13, 9, 8, dtype, true);
    qt::CliResult r =
        qt::run_cli(fmt::format("op algproj --law Q2xQ2 --schedule interval:8 --in-groups 1,3,2,3 "
                                "--out-groups 2,2,1,3 --in {} --out {}",
                                dir.file("in.safetensors"), dir.file("out.safetensors")),
                    dir);
    ASSERT_EQ(r.status, 0) << r.err;
    TensorFile out = read_safetensors(dir.file("out.safetensors"));
    EXPECT_EQ(out.get("y").dtype(), dtype);
    algebra::Law law = algebra::Law::parse("Q2xQ2");
    algebra::GroupWidths widths{{1, 3, 2, 3}, {2, 2, 1, 3}};
    std::vector<int> types = algebra::Schedule::interval(8).types(0, 13, 4);
    Tensor y = Tensor::empty({13, 8}, DType::F64), dx = Tensor::empty({13, 9}, DType::F64),
           dw = Tensor::empty({9, 8}, DType::F64);
    ops::algproj_reference_forward(in.x, in.w, law, widths, types, y);
    ops::algproj_reference_backward(in.x, in.w, in.dy, law, widths, types, dx, dw);
    double tol = dtype == DType::F64 ? 1e-13 : 1e-5;
    EXPECT_LT(rel_error(out.get("y"), y), tol);
    EXPECT_LT(rel_error(out.get("dx"), dx), tol);
    EXPECT_LT(rel_error(out.get("dw"), dw), tol);
  }
  // Without dy only y is written.
  write_inputs(dir.file("in2.safetensors"), 6, 8, 8, DType::F64, false);
  ASSERT_EQ(qt::run_cli(fmt::format("op algproj --law Q4 --in {} --out {}",
                                    dir.file("in2.safetensors"), dir.file("out2.safetensors")),
                        dir)
                .status,
            0);
  TensorFile out2 = read_safetensors(dir.file("out2.safetensors"));
  EXPECT_TRUE(out2.has("y"));
  EXPECT_FALSE(out2.has("dx"));
}

TEST(AlgProjCli, BadInputExitsNonZeroNamingTheProblem) {
  qt::ScratchDir dir("algproj_cli_bad");
  std::string in = dir.file("in.safetensors"), out = dir.file("out.safetensors");
  Rng rng(3);
  auto expect_error = [&](const std::string& args, const std::string& needle) {
    qt::CliResult r = qt::run_cli("op algproj " + args, dir);
    EXPECT_NE(r.status, 0) << args;
    EXPECT_NE(r.err.find(needle), std::string::npos) << args << " → " << r.err;
  };
  write_safetensors(in, {{"x", qt::random_tensor({4, 8}, DType::F32, rng)}});
  expect_error(fmt::format("--law Q2 --in {} --out {}", in, out), "'w'");
  write_safetensors(in, {{"x", qt::random_tensor({4, 8}, DType::F32, rng)},
                         {"w", qt::random_tensor({6, 4}, DType::F32, rng)}});
  expect_error(fmt::format("--law Q2 --in {} --out {}", in, out),
               "x has 8 features but w has 6 rows");
  write_safetensors(in, {{"x", qt::random_tensor({4, 8}, DType::F32, rng)},
                         {"w", qt::random_tensor({8, 4}, DType::F32, rng)},
                         {"dy", qt::random_tensor({4, 5}, DType::F32, rng)}});
  expect_error(fmt::format("--law Q2 --in {} --out {}", in, out), "dy: expected shape [4, 4]");
  expect_error(fmt::format("--law Q2 --in-groups 3,4 --out-groups 2,2 --in {} --out {}", in, out),
               "sum to 7");
  expect_error(fmt::format("--law Q3 --in {} --out {}", in, out), "not divisible");
  expect_error(fmt::format("--law nope --in {} --out {}", in, out), "unknown law");
  expect_error(fmt::format("--law Q2 --schedule interval:3 --in {} --out {}", in, out),
               "not divisible by q");
  // A truncated file is reported as such, and no output appears.
  std::string bytes = qt::read_text(in);
  std::ofstream(in, std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size() / 2));
  expect_error(fmt::format("--law Q2 --in {} --out {}", in, out), in);
  EXPECT_FALSE(std::filesystem::exists(out));
  expect_error(fmt::format("--law Q2 --in {} --out {}", dir.file("missing.safetensors"), out),
               "missing.safetensors");
}

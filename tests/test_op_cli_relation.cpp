// `quiver op relation` and `quiver op attention` end to end: inputs written with
// write_safetensors, the built binary run with std::system, its outputs compared with direct
// calls of the ops.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include <fmt/format.h>

#include "ops/attention.h"
#include "ops/relation.h"
#include "quiver/rng.h"
#include "quiver/safetensors.h"
#include "testing.h"

using namespace quiver;
namespace fs = std::filesystem;
using quiver::testing::random_tensor;

namespace {

// A scratch directory per test and a runner for `quiver op NAME ARGS`.
class OpCli : public ::testing::Test {
 protected:
  std::string file(const std::string& name) const { return dir_.file(name); }

  // Runs `quiver op OP ARGS`; returns the exit status, stderr into err.
  int run(const std::string& op, const std::string& args, std::string& err) const {
    quiver::testing::CliResult r = quiver::testing::run_cli(fmt::format("op {} {}", op, args), dir_);
    err = r.err;
    return r.status;
  }

  quiver::testing::ScratchDir dir_{
      std::string("op_") + ::testing::UnitTest::GetInstance()->current_test_info()->name()};
};

class RelationCli : public OpCli {};
class AttentionCli : public OpCli {};

double tolerance(DType dtype) { return dtype == DType::F32 ? 1e-6 : 1e-13; }

}  // namespace

TEST_F(RelationCli, ReferenceAndFlashMatchDirectCalls) {
  struct Case {
    std::string impl;
    double tau;
    bool exchange_only;
    Shape shape;
    DType dtype;
  };
  const Case cases[] = {{"reference", 2.0, false, {11, 2, 6}, DType::F64},
                        {"flash", 1.5, true, {2, 70, 2, 8}, DType::F32},
                        {"flash", 2.0, false, {67, 3, 24}, DType::F64}};
  Rng rng(51);
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << c.impl << " tau=" << c.tau
                                      << " exchange_only=" << c.exchange_only << " "
                                      << shape_str(c.shape) << " " << dtype_name(c.dtype));
    Tensor lambda = Tensor::empty({1}, c.dtype);
    lambda.fill(0.45);
    std::map<std::string, Tensor> in{{"p1", random_tensor(c.shape, c.dtype, rng, 1.5)},
                                     {"p2", random_tensor(c.shape, c.dtype, rng, 1.5)},
                                     {"v", random_tensor(c.shape, c.dtype, rng)},
                                     {"lambda", lambda},
                                     {"dy", random_tensor(c.shape, c.dtype, rng)}};
    write_safetensors(file("in.safetensors"), in);
    std::string err;
    const std::string args = fmt::format("--impl {} --tau {} {} --in \"{}\" --out \"{}\"", c.impl,
                                         c.tau, c.exchange_only ? "--exchange-only" : "",
                                         file("in.safetensors"), file("out.safetensors"));
    ASSERT_EQ(run("relation", args, err), 0) << err;
    TensorFile out = read_safetensors(file("out.safetensors"));

    ops::RelationOptions opt;
    opt.tau_s = c.tau;
    opt.exchange_only = c.exchange_only;
    Tensor y, stats, dp1, dp2, dv;
    double dlambda;
    if (c.impl == "flash") {
      ops::flash_relation_forward(in["p1"], in["p2"], in["v"], 0.45, y, stats, opt);
      dlambda = ops::flash_relation_backward(in["p1"], in["p2"], in["v"], 0.45, y, stats, in["dy"],
                                             dp1, dp2, dv, opt);
    } else {
      ops::relation_reference_forward(in["p1"], in["p2"], in["v"], 0.45, y, opt);
      dlambda = ops::relation_reference_backward(in["p1"], in["p2"], in["v"], 0.45, in["dy"], dp1,
                                                 dp2, dv, opt);
    }
    const double tol = tolerance(c.dtype);
    EXPECT_LE(rel_error(out.get("y"), y), tol);
    EXPECT_LE(rel_error(out.get("dp1"), dp1), tol);
    EXPECT_LE(rel_error(out.get("dp2"), dp2), tol);
    EXPECT_LE(rel_error(out.get("dv"), dv), tol);
    ASSERT_EQ(out.get("dlambda").shape(), Shape({1}));
    EXPECT_EQ(out.get("dlambda").dtype(), c.dtype);
    EXPECT_NEAR(out.get("dlambda").at({0}), dlambda, tol * std::max(1.0, std::fabs(dlambda)));
  }
}

TEST_F(RelationCli, ForwardOnlyWithoutDy) {
  Rng rng(52);
  const Shape shape{9, 2, 4};
  Tensor lambda = Tensor::zeros({1}, DType::F64);
  std::map<std::string, Tensor> in{{"p1", random_tensor(shape, DType::F64, rng)},
                                   {"p2", random_tensor(shape, DType::F64, rng)},
                                   {"v", random_tensor(shape, DType::F64, rng)},
                                   {"lambda", lambda}};
  write_safetensors(file("in.safetensors"), in);
  std::string err;
  ASSERT_EQ(run("relation",
                fmt::format("--impl flash --in \"{}\" --out \"{}\"", file("in.safetensors"),
                            file("out.safetensors")),
                err),
            0)
      << err;
  TensorFile out = read_safetensors(file("out.safetensors"));
  EXPECT_EQ(out.tensors.size(), 1u);
  Tensor y;
  ops::relation_reference_forward(in["p1"], in["p2"], in["v"], 0.0, y);
  EXPECT_LE(rel_error(out.get("y"), y), 1e-12);
}

TEST_F(RelationCli, MissingOrMismatchedTensorFailsNamingIt) {
  Rng rng(53);
  const Shape shape{5, 2, 4};
  std::map<std::string, Tensor> in{{"p1", random_tensor(shape, DType::F64, rng)},
                                   {"p2", random_tensor(shape, DType::F64, rng)},
                                   {"v", random_tensor(shape, DType::F64, rng)}};
  write_safetensors(file("in.safetensors"), in);
  const std::string args = fmt::format("--impl reference --in \"{}\" --out \"{}\"",
                                       file("in.safetensors"), file("out.safetensors"));
  std::string err;
  EXPECT_NE(run("relation", args, err), 0);
  EXPECT_NE(err.find("'lambda'"), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(file("out.safetensors")));

  in["lambda"] = Tensor::zeros({1}, DType::F32);  // F32 beside F64 inputs
  write_safetensors(file("in.safetensors"), in);
  EXPECT_NE(run("relation", args, err), 0);
  EXPECT_NE(err.find("lambda"), std::string::npos) << err;

  in["lambda"] = Tensor::zeros({1}, DType::F64);
  in["v"] = random_tensor({5, 2, 3}, DType::F64, rng);
  write_safetensors(file("in.safetensors"), in);
  EXPECT_NE(run("relation", args, err), 0);
  EXPECT_NE(err.find("v:"), std::string::npos) << err;
}

TEST_F(AttentionCli, ForwardAndBackwardMatchDirectCalls) {
  struct Case {
    Shape q_shape, kv_shape;
    DType dtype;
  };
  const Case cases[] = {{{2, 19, 4, 8}, {2, 19, 2, 8}, DType::F64},
                        {{70, 3, 16}, {70, 3, 16}, DType::F32}};
  Rng rng(54);
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << shape_str(c.q_shape) << " " << dtype_name(c.dtype));
    std::map<std::string, Tensor> in{{"q", random_tensor(c.q_shape, c.dtype, rng)},
                                     {"k", random_tensor(c.kv_shape, c.dtype, rng)},
                                     {"v", random_tensor(c.kv_shape, c.dtype, rng)},
                                     {"dy", random_tensor(c.q_shape, c.dtype, rng)}};
    write_safetensors(file("in.safetensors"), in);
    std::string err;
    ASSERT_EQ(run("attention",
                  fmt::format("--in \"{}\" --out \"{}\"", file("in.safetensors"),
                              file("out.safetensors")),
                  err),
              0)
        << err;
    TensorFile out = read_safetensors(file("out.safetensors"));
    Tensor y, dq, dk, dv;
    ops::attention_reference_forward(in["q"], in["k"], in["v"], y);
    ops::attention_reference_backward(in["q"], in["k"], in["v"], in["dy"], dq, dk, dv);
    const double tol = c.dtype == DType::F32 ? 1e-5 : 1e-12;
    EXPECT_LE(rel_error(out.get("y"), y), tol);
    EXPECT_LE(rel_error(out.get("dq"), dq), tol);
    EXPECT_LE(rel_error(out.get("dk"), dk), tol);
    EXPECT_LE(rel_error(out.get("dv"), dv), tol);
  }
}

TEST_F(AttentionCli, MissingTensorFailsNamingIt) {
  Rng rng(55);
  std::map<std::string, Tensor> in{{"q", random_tensor({4, 2, 8}, DType::F64, rng)},
                                   {"v", random_tensor({4, 2, 8}, DType::F64, rng)}};
  write_safetensors(file("in.safetensors"), in);
  std::string err;
  EXPECT_NE(run("attention",
                fmt::format("--in \"{}\" --out \"{}\"", file("in.safetensors"),
                            file("out.safetensors")),
                err),
            0);
  EXPECT_NE(err.find("'k'"), std::string::npos) << err;
}

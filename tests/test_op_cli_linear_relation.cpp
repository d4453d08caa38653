// `quiver op linear_relation` end to end: inputs written with write_safetensors, the built
// binary run with std::system, its outputs compared with direct calls of the ops.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "ops/linear_relation.h"
#include "quiver/rng.h"
#include "quiver/safetensors.h"
#include "testing.h"

using namespace quiver;
namespace fs = std::filesystem;
using quiver::testing::random_tensor;

namespace {

class LinearRelationCli : public ::testing::Test {
 protected:
  std::string file(const std::string& name) const { return dir_.file(name); }

  // Runs `quiver op linear_relation ARGS`; returns the exit status, stderr into err.
  int run(const std::string& args, std::string& err) const {
    quiver::testing::CliResult r = quiver::testing::run_cli("op linear_relation " + args, dir_);
    err = r.err;
    return r.status;
  }

  quiver::testing::ScratchDir dir_{std::string("op_linear_relation_") +
                                   ::testing::UnitTest::GetInstance()->current_test_info()->name()};

  std::map<std::string, Tensor> inputs(const Shape& shape, DType dtype, bool with_dy) const {
    Rng rng(41);
    std::map<std::string, Tensor> t{{"p1", random_tensor(shape, dtype, rng)},
                                    {"p2", random_tensor(shape, dtype, rng)},
                                    {"v", random_tensor(shape, dtype, rng)}};
    Tensor g = Tensor::empty(shape, dtype);
    rng.fill_uniform(g, -1.0, 0.0);
    t["g"] = g;
    if (with_dy) t["dy"] = random_tensor(shape, dtype, rng);
    return t;
  }

};

}  // namespace

TEST_F(LinearRelationCli, ForwardAndBackwardMatchDirectCalls) {
  struct Case {
    std::string impl;
    int64_t chunk;
    double tau;
    Shape shape;
    DType dtype;
  };
  const Case cases[] = {{"chunked", 5, 2.0, {2, 13, 3, 4}, DType::F64},
                        {"recurrent", 0, 1.5, {13, 3, 4}, DType::F64},
                        {"chunked", 64, 2.0, {11, 2, 5}, DType::F32}};
  for (const Case& c : cases) {
    auto in = inputs(c.shape, c.dtype, true);
    write_safetensors(file("in.safetensors"), in);
    std::string args = fmt::format("--impl {} --tau {} --in \"{}\" --out \"{}\"", c.impl, c.tau,
                                   file("in.safetensors"), file("out.safetensors"));
    if (c.chunk > 0) args += fmt::format(" --chunk {}", c.chunk);
    std::string err;
    ASSERT_EQ(run(args, err), 0) << err;
    TensorFile out = read_safetensors(file("out.safetensors"));

    Tensor y = Tensor::empty(c.shape, c.dtype);
    Tensor dp1 = Tensor::empty(c.shape, c.dtype), dp2 = Tensor::empty(c.shape, c.dtype);
    Tensor dv = Tensor::empty(c.shape, c.dtype), dg = Tensor::empty(c.shape, c.dtype);
    if (c.impl == "chunked") {
      ops::linear_relation_chunked_forward(in["p1"], in["p2"], in["v"], in["g"], y, c.chunk, c.tau);
      ops::linear_relation_chunked_backward(in["p1"], in["p2"], in["v"], in["g"], in["dy"], dp1,
                                            dp2, dv, dg, c.chunk, c.tau);
    } else {
      ops::linear_relation_recurrent_forward(in["p1"], in["p2"], in["v"], in["g"], y, c.tau);
      ops::linear_relation_recurrent_backward(in["p1"], in["p2"], in["v"], in["g"], in["dy"], dp1,
                                              dp2, dv, dg, c.tau);
    }
    for (auto [name, expect] : std::map<std::string, Tensor>{
             {"y", y}, {"dp1", dp1}, {"dp2", dp2}, {"dv", dv}, {"dg", dg}}) {
      const Tensor& got = out.get(name);
      EXPECT_EQ(got.dtype(), c.dtype) << name;
      EXPECT_EQ(got.shape(), c.shape) << name;
      EXPECT_EQ(rel_error(got, expect), 0.0) << c.impl << " " << name;
    }
  }
}

TEST_F(LinearRelationCli, ForwardOnlyWithoutDy) {
  auto in = inputs({9, 2, 3}, DType::F64, false);
  write_safetensors(file("in.safetensors"), in);
  std::string err;
  ASSERT_EQ(run(fmt::format("--impl recurrent --in \"{}\" --out \"{}\"", file("in.safetensors"),
                            file("out.safetensors")),
                err),
            0)
      << err;
  TensorFile out = read_safetensors(file("out.safetensors"));
  EXPECT_TRUE(out.has("y"));
  EXPECT_FALSE(out.has("dp1"));
  Tensor y = Tensor::empty({9, 2, 3}, DType::F64);
  ops::linear_relation_recurrent_forward(in["p1"], in["p2"], in["v"], in["g"], y);
  EXPECT_EQ(rel_error(out.get("y"), y), 0.0);
}

TEST_F(LinearRelationCli, ErrorsNameTheProblem) {
  auto io = [&] {
    return fmt::format("--impl chunked --in \"{}\" --out \"{}\"", file("in.safetensors"),
                       file("out.safetensors"));
  };
  std::string err;
  {
    auto in = inputs({6, 2, 3}, DType::F64, false);
    in.erase("g");
    write_safetensors(file("in.safetensors"), in);
    EXPECT_NE(run(io(), err), 0);
    EXPECT_NE(err.find("quiver: error:"), std::string::npos) << err;
    EXPECT_NE(err.find("'g'"), std::string::npos) << err;
  }
  {
    auto in = inputs({6, 2, 3}, DType::F64, false);
    in["g"].data<double>()[7] = 0.5;
    write_safetensors(file("in.safetensors"), in);
    EXPECT_NE(run(io(), err), 0);
    EXPECT_NE(err.find("g:"), std::string::npos) << err;
    EXPECT_NE(err.find("0.5"), std::string::npos) << err;
  }
  {
    auto in = inputs({6, 2, 3}, DType::F64, false);
    in["v"] = in["v"].to(DType::F32);
    write_safetensors(file("in.safetensors"), in);
    EXPECT_NE(run(io(), err), 0);
    EXPECT_NE(err.find("v:"), std::string::npos) << err;
    EXPECT_NE(err.find("F32"), std::string::npos) << err;
  }
  {
    auto in = inputs({6, 2, 3}, DType::F64, false);
    Rng rng(3);
    in["p2"] = random_tensor({6, 2, 4}, DType::F64, rng);
    write_safetensors(file("in.safetensors"), in);
    EXPECT_NE(run(io(), err), 0);
    EXPECT_NE(err.find("p2"), std::string::npos) << err;
    EXPECT_NE(err.find("[6, 2, 4]"), std::string::npos) << err;
  }
  EXPECT_NE(run(fmt::format("--impl sideways --in \"{}\" --out \"{}\"", file("in.safetensors"),
                            file("out.safetensors")),
                err),
            0);
  EXPECT_FALSE(fs::exists(file("out.safetensors")));
}

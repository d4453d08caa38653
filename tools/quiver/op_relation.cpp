// `quiver op relation`: Self–Exchange Relation (SPEC §2.1–2.3, §2.6) on tensors read from a
// safetensors file, through the materialized reference or FlashRelation: the forward, and
// the backward when the file holds dy.
#include <map>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "commands.h"
#include "ops/relation.h"
#include "quiver/safetensors.h"

namespace quiver::cli {
namespace {

struct RelationArgs {
  std::string impl, in, out;
  double tau = 2.0;
  bool exchange_only = false;
  int64_t tile = 64;
};

// All inputs must share p1's dtype, which must be F32 or F64.
void check_input_dtype(const Tensor& t, const Tensor& p1, const char* name) {
  QV_CHECK(t.dtype() == p1.dtype(),
           "{}: dtype {} differs from p1's {} (the inputs must be all F32 or all F64)", name,
           dtype_name(t.dtype()), dtype_name(p1.dtype()));
}

void run_relation(const RelationArgs& a) {
  TensorFile in = read_safetensors(a.in);
  const Tensor& p1 = in.get("p1");
  const Tensor& p2 = in.get("p2");
  const Tensor& v = in.get("v");
  const Tensor& lambda_t = in.get("lambda");
  QV_CHECK(p1.dtype() == DType::F32 || p1.dtype() == DType::F64,
           "p1: dtype must be F32 or F64, got {}", dtype_name(p1.dtype()));
  check_input_dtype(p2, p1, "p2");
  check_input_dtype(v, p1, "v");
  check_input_dtype(lambda_t, p1, "lambda");
  check_shape(lambda_t, {1}, "lambda");
  const double lambda = lambda_t.at({0});

  ops::RelationOptions opt;
  opt.tau_s = a.tau;
  opt.exchange_only = a.exchange_only;
  opt.tile = a.tile;
  const bool flash = a.impl == "flash";

  std::map<std::string, Tensor> out;
  Tensor y, stats;
  if (flash)
    ops::flash_relation_forward(p1, p2, v, lambda, y, stats, opt);
  else
    ops::relation_reference_forward(p1, p2, v, lambda, y, opt);
  out["y"] = y;
  if (in.has("dy")) {
    const Tensor& dy = in.get("dy");
    check_input_dtype(dy, p1, "dy");
    Tensor dp1, dp2, dv;
    const double dlambda =
        flash ? ops::flash_relation_backward(p1, p2, v, lambda, y, stats, dy, dp1, dp2, dv, opt)
              : ops::relation_reference_backward(p1, p2, v, lambda, dy, dp1, dp2, dv, opt);
    Tensor dl = Tensor::empty({1}, p1.dtype());
    dl.fill(dlambda);
    out["dp1"] = dp1;
    out["dp2"] = dp2;
    out["dv"] = dv;
    out["dlambda"] = dl;
  }
  std::map<std::string, std::string> meta{{"op", "relation"},
                                          {"impl", a.impl},
                                          {"tau_s", fmt::format("{}", a.tau)},
                                          {"exchange_only", a.exchange_only ? "true" : "false"}};
  if (flash) meta["tile"] = std::to_string(a.tile);
  write_safetensors(a.out, out, meta);
}

}  // namespace

void register_op_relation(CLI::App& op) {
  auto args = std::make_shared<RelationArgs>();
  CLI::App* cmd = op.add_subcommand(
      "relation",
      "Self–Exchange Relation (SPEC §2.1): U_pj = p1_p·p2_j / sqrt(Dh), S_p = sigmoid(U_pp / tau),\n"
      "R_pj = S_p (j = p), SiLU(U_pj) − λ log(p+1) (j < p); y_p = Σ_{j≤p} softmax(R_p)_j v_j.\n"
      "--exchange-only transports only the historical entries of that same flow, not\n"
      "renormalized: y_p = Σ_{j<p} F_pj v_j (y_0 = 0).\n"
      "Reads (all F32 or all F64; a leading batch dim [B, ...] is allowed on p1, p2, v, dy):\n"
      "  p1, p2  [T, H, Dh]  relation projections after RoPE\n"
      "  v       [T, H, Dh]  information states after the Givens mixing (Ĩ)\n"
      "  lambda  [1]         count-calibration coefficient λ, shared by the heads\n"
      "  dy      [T, H, Dh]  optional: dL/dy; when present the backward runs too\n"
      "Writes y [T, H, Dh]; with dy also dp1, dp2, dv [T, H, Dh] and dlambda [1].");
  cmd->add_option("--impl", args->impl, "reference (materialized U, R, F) or flash (FlashRelation)")
      ->required()
      ->check(CLI::IsMember({"reference", "flash"}));
  cmd->add_option("--tau", args->tau, "Self temperature τ_S")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_flag("--exchange-only", args->exchange_only,
                "the exchange-only transport ablation (SPEC §2.6)");
  cmd->add_option("--tile", args->tile, "FlashRelation: query rows and key columns per tile")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--in", args->in, "input safetensors file")->required();
  cmd->add_option("--out", args->out, "output safetensors file (written atomically)")->required();
  cmd->callback([args] { run_relation(*args); });
}

}  // namespace quiver::cli

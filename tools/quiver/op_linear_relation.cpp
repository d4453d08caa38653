// `quiver op linear_relation`: the Linear Relation token mixer (SPEC §2.4) on tensors read
// from a safetensors file: the forward, and the backward when the file holds dy.
#include <fmt/format.h>

#include <map>
#include <memory>
#include <string>

#include "commands.h"
#include "ops/linear_relation.h"
#include "quiver/safetensors.h"

namespace quiver::cli {
namespace {

struct LinearRelationOptions {
  std::string impl;
  int64_t chunk = ops::kLinearRelationDefaultChunk;
  double tau = ops::kLinearRelationDefaultTau;
  std::string in, out;
};

// All inputs must share p1's dtype, which must be F32 or F64.
void check_input_dtype(const Tensor& t, const Tensor& p1, const char* name) {
  QV_CHECK(t.dtype() == p1.dtype(),
           "{}: dtype {} differs from p1's {} (the inputs must be all F32 or all F64)", name,
           dtype_name(t.dtype()), dtype_name(p1.dtype()));
}

void run_linear_relation(const LinearRelationOptions& o) {
  TensorFile in = read_safetensors(o.in);
  const Tensor& p1 = in.get("p1");
  const Tensor& p2 = in.get("p2");
  const Tensor& v = in.get("v");
  const Tensor& g = in.get("g");
  QV_CHECK(p1.dtype() == DType::F32 || p1.dtype() == DType::F64,
           "p1: dtype must be F32 or F64, got {}", dtype_name(p1.dtype()));
  check_input_dtype(p2, p1, "p2");
  check_input_dtype(v, p1, "v");
  check_input_dtype(g, p1, "g");
  const bool chunked = o.impl == "chunked";

  std::map<std::string, Tensor> out;
  Tensor y = Tensor::empty(p1.shape(), p1.dtype());
  if (chunked)
    ops::linear_relation_chunked_forward(p1, p2, v, g, y, o.chunk, o.tau);
  else
    ops::linear_relation_recurrent_forward(p1, p2, v, g, y, o.tau);
  out["y"] = y;

  if (in.has("dy")) {
    const Tensor& dy = in.get("dy");
    check_input_dtype(dy, p1, "dy");
    Tensor dp1 = Tensor::empty(p1.shape(), p1.dtype()), dp2 = Tensor::empty(p1.shape(), p1.dtype());
    Tensor dv = Tensor::empty(p1.shape(), p1.dtype()), dg = Tensor::empty(p1.shape(), p1.dtype());
    if (chunked)
      ops::linear_relation_chunked_backward(p1, p2, v, g, dy, dp1, dp2, dv, dg, o.chunk, o.tau);
    else
      ops::linear_relation_recurrent_backward(p1, p2, v, g, dy, dp1, dp2, dv, dg, o.tau);
    out["dp1"] = dp1;
    out["dp2"] = dp2;
    out["dv"] = dv;
    out["dg"] = dg;
  }
  std::map<std::string, std::string> meta{
      {"op", "linear_relation"}, {"impl", o.impl}, {"tau_s", fmt::format("{}", o.tau)}};
  if (chunked) meta["chunk"] = std::to_string(o.chunk);
  write_safetensors(o.out, out, meta);
}

}  // namespace

void register_op_linear_relation(CLI::App& op) {
  auto o = std::make_shared<LinearRelationOptions>();
  CLI::App* cmd = op.add_subcommand(
      "linear_relation",
      "Linear Relation (SPEC §2.4): y = v + E with E_t = S_t (Diag(α_t) C_{t-1})ᵀ p̂1_t,\n"
      "C_t = Diag(α_t) C_{t-1} + S_t p̂2_t v_tᵀ, S_t = sigmoid(p1_t·p2_t / (tau sqrt(Dh))),\n"
      "p̂ = p / max(‖p‖, 1e-12), α_t = exp(g_t); strictly causal (y_0 = v_0).\n"
      "Reads (all F32 or all F64; shape [T, H, Dh] or [B, T, H, Dh]):\n"
      "  p1, p2  relation projections after RoPE, before normalization\n"
      "  v       information states (Ĩ)\n"
      "  g       log-decay log α_t, every element finite and <= 0\n"
      "  dy      optional: dL/dy; when present the backward runs too\n"
      "Writes (same shape and dtype): y; with dy also dp1, dp2, dv, dg.");
  cmd->add_option("--impl", o->impl, "recurrent (the reference) or chunked (chunkwise-parallel)")
      ->required()
      ->check(CLI::IsMember({"recurrent", "chunked"}));
  cmd->add_option("--chunk", o->chunk, "chunk length of the chunked form")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--tau", o->tau, "temperature τ_S of the self gate S")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--in", o->in, "input safetensors file")->required();
  cmd->add_option("--out", o->out, "output safetensors file (written atomically)")->required();
  cmd->callback([o] { run_linear_relation(*o); });
}

}  // namespace quiver::cli

// `quiver op attention`: causal multi-head attention (optionally with grouped KV heads) on
// tensors read from a safetensors file: the flash forward, and the backward when the file
// holds dy.
#include <map>
#include <memory>
#include <string>

#include "commands.h"
#include "ops/attention.h"
#include "quiver/safetensors.h"

namespace quiver::cli {
namespace {

struct AttentionArgs {
  std::string in, out;
  int64_t tile = 64;
};

// All inputs must share q's dtype, which must be F32 or F64.
void check_input_dtype(const Tensor& t, const Tensor& q, const char* name) {
  QV_CHECK(t.dtype() == q.dtype(),
           "{}: dtype {} differs from q's {} (the inputs must be all F32 or all F64)", name,
           dtype_name(t.dtype()), dtype_name(q.dtype()));
}

void run_attention(const AttentionArgs& a) {
  TensorFile in = read_safetensors(a.in);
  const Tensor& q = in.get("q");
  const Tensor& k = in.get("k");
  const Tensor& v = in.get("v");
  QV_CHECK(q.dtype() == DType::F32 || q.dtype() == DType::F64,
           "q: dtype must be F32 or F64, got {}", dtype_name(q.dtype()));
  check_input_dtype(k, q, "k");
  check_input_dtype(v, q, "v");

  std::map<std::string, Tensor> out;
  Tensor y, lse;
  ops::attention_forward(q, k, v, y, lse, a.tile);
  out["y"] = y;
  if (in.has("dy")) {
    const Tensor& dy = in.get("dy");
    check_input_dtype(dy, q, "dy");
    Tensor dq, dk, dv;
    ops::attention_backward(q, k, v, y, lse, dy, dq, dk, dv, a.tile);
    out["dq"] = dq;
    out["dk"] = dk;
    out["dv"] = dv;
  }
  write_safetensors(a.out, out, {{"op", "attention"}, {"causal", "true"}});
}

}  // namespace

void register_op_attention(CLI::App& op) {
  auto args = std::make_shared<AttentionArgs>();
  CLI::App* cmd = op.add_subcommand(
      "attention",
      "Causal multi-head attention y_p = Σ_{j≤p} softmax_j(q_p·k_j / sqrt(Dh)) v_j, flash-tiled,\n"
      "with grouped KV heads (query head h reads kv head h / (Hq / Hkv)).\n"
      "Reads (all F32 or all F64; a leading batch dim [B, ...] is allowed on all of them):\n"
      "  q   [T, Hq, Dh]    queries after RoPE\n"
      "  k   [T, Hkv, Dh]   keys after RoPE (Hkv divides Hq)\n"
      "  v   [T, Hkv, Dh]   values\n"
      "  dy  [T, Hq, Dh]    optional: dL/dy; when present the backward runs too\n"
      "Writes y [T, Hq, Dh]; with dy also dq (shape of q), dk and dv (shape of k).");
  cmd->add_option("--in", args->in, "input safetensors file")->required();
  cmd->add_option("--out", args->out, "output safetensors file (written atomically)")->required();
  cmd->add_option("--tile", args->tile, "query rows and key rows per tile")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->callback([args] { run_attention(*args); });
}

}  // namespace quiver::cli

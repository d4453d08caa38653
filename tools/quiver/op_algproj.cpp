// `quiver op algproj`: the algebraic projection on tensors from a safetensors file.
#include <memory>

#include "algebra/law.h"
#include "commands.h"
#include "ops/algproj.h"
#include "quiver/safetensors.h"

namespace quiver::cli {

namespace {

struct AlgProjArgs {
  std::string law, schedule = "cyclic", in, out, in_groups, out_groups;
  int64_t pos0 = 0;
};

void run(const AlgProjArgs& a) {
  algebra::Law law = algebra::Law::parse(a.law);
  algebra::Schedule schedule = algebra::Schedule::parse(a.schedule);
  schedule.validate(law.q());
  TensorFile file = read_safetensors(a.in);
  const Tensor& x_in = file.get("x");
  const Tensor& w = file.get("w");
  QV_CHECK(x_in.ndim() == 2 || x_in.ndim() == 3, "x: expected [M, K] or [B, T, K], got {}",
           shape_str(x_in.shape()));
  check_ndim(w, 2, "w");
  const int64_t K = w.dim(0), N = w.dim(1);
  const int64_t batch = x_in.ndim() == 3 ? x_in.dim(0) : 1;
  const int64_t T = x_in.ndim() == 3 ? x_in.dim(1) : x_in.dim(0);
  QV_CHECK(x_in.dim(-1) == K, "x has {} features but w has {} rows (x {}, w {})", x_in.dim(-1), K,
           shape_str(x_in.shape()), shape_str(w.shape()));
  Tensor x = x_in.reshape({batch * T, K});

  algebra::GroupWidths widths;
  if (a.in_groups.empty() && a.out_groups.empty()) {
    widths = algebra::GroupWidths::equal(law.q(), K, N);
  } else {
    QV_CHECK(!a.in_groups.empty() && !a.out_groups.empty(),
             "give both --in-groups and --out-groups");
    widths.in = algebra::parse_widths(a.in_groups, "--in-groups");
    widths.out = algebra::parse_widths(a.out_groups, "--out-groups");
  }
  widths.validate(law.q(), K, N);
  ops::AlgProj proj(law, widths);
  std::vector<int> types = schedule.batch_types(batch, T, a.pos0, law.q());

  Shape y_shape = x_in.shape();
  y_shape.back() = N;
  std::map<std::string, Tensor> out;
  Tensor y = Tensor::empty({batch * T, N}, x.dtype());
  proj.forward(x, w, types, y);
  out["y"] = y.reshape(y_shape);
  if (file.has("dy")) {
    const Tensor& dy = file.get("dy");
    check_shape(dy, y_shape, "dy");
    Tensor dx = Tensor::empty({batch * T, K}, x.dtype()), dw = Tensor::empty({K, N}, x.dtype());
    proj.backward(x, w, dy.reshape({batch * T, N}), types, &dx, &dw);
    out["dx"] = dx.reshape(x_in.shape());
    out["dw"] = dw;
  }
  write_safetensors(a.out, out,
                    {{"op", "algproj"}, {"law", law.name()}, {"schedule", schedule.name()}});
}

}  // namespace

void register_op_algproj(CLI::App& op) {
  auto args = std::make_shared<AlgProjArgs>();
  CLI::App* cmd = op.add_subcommand(
      "algproj",
      "Algebraic projection Y = Φ_W(X) (SPEC §1.3) and its gradients.\n"
      "  reads   x  [M, K] or [B, T, K]   activations (row types from the schedule over positions\n"
      "                                   pos0.. of each sequence)\n"
      "          w  [K, N]                the weight bank (canonical K×N layout)\n"
      "          dy [M, N] (optional)     upstream gradient\n"
      "  writes  y  [M, N]; with dy also dx [M, K] and dw [K, N]\n"
      "All tensors F32 or all F64; the op computes in that precision.");
  cmd->add_option("--law", args->law, "law: dense, Q4, Q2xQ2, graph:4:0>1,1>2, blockdiag:4, ...")
      ->required();
  cmd->add_option("--schedule", args->schedule, "row types: cyclic | interval:P | table:t0,t1,...")
      ->capture_default_str();
  cmd->add_option("--in", args->in, "input safetensors file")->required();
  cmd->add_option("--out", args->out, "output safetensors file (written atomically)")->required();
  cmd->add_option("--in-groups", args->in_groups,
                  "input group widths a,b,... (sum K; default equal)");
  cmd->add_option("--out-groups", args->out_groups,
                  "output group widths a,b,... (sum N; default equal)");
  cmd->add_option("--pos0", args->pos0, "absolute position of the first row of each sequence")
      ->capture_default_str();
  cmd->callback([args] { run(*args); });
}

}  // namespace quiver::cli

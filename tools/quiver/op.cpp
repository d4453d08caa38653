// `quiver op NAME`: run one op on tensors read from a safetensors file and write its
// outputs to another, so users can check quiver against their own framework.
#include "commands.h"

namespace quiver::cli {

void register_op(CLI::App& app) {
  CLI::App* op = app.add_subcommand(
      "op",
      "Run one op on tensors from a safetensors file and write its outputs to another.\n"
      "Each op computes in its inputs' precision (F32 or F64). `quiver op NAME --help` lists\n"
      "the tensor names and shapes it reads and writes.");
  op->require_subcommand(1);
  register_op_algproj(*op);
  register_op_attention(*op);
  register_op_relation(*op);
  register_op_linear_relation(*op);
}

}  // namespace quiver::cli

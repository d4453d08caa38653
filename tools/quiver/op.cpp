// `quiver op NAME`: run one op on tensors read from a safetensors file and write its
// outputs to another, so users can check quiver against their own framework.
#include "commands.h"

namespace quiver::cli {

void register_op(CLI::App& app) {
  CLI::App* op = app.add_subcommand(
      "op",
      "Run one op on tensors from a safetensors file (see `quiver op NAME --help` for tensor "
      "names and shapes)");
  op->require_subcommand(1);
  register_op_algproj(*op);
}

}  // namespace quiver::cli

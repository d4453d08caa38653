#include "commands.h"
namespace quiver::cli {
void register_op_algproj(CLI::App& op) { op.add_subcommand("algproj", "Algebraic projection"); }
}  // namespace quiver::cli

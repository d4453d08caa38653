#include "commands.h"
namespace quiver::cli {
void register_op_linear_relation(CLI::App& op) { op.add_subcommand("linear_relation", "(not yet implemented)"); }
}  // namespace quiver::cli

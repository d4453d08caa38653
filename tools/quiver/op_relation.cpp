#include "commands.h"
namespace quiver::cli {
void register_op_relation(CLI::App& op) { op.add_subcommand("relation", "(not yet implemented)"); }
}  // namespace quiver::cli

#include "commands.h"
namespace quiver::cli {
void register_op_attention(CLI::App& op) { op.add_subcommand("attention", "(not yet implemented)"); }
}  // namespace quiver::cli

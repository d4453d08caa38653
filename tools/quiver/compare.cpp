#include "commands.h"
namespace quiver::cli {
void register_compare(CLI::App& app) { app.add_subcommand("compare", "(not yet implemented)"); }
}  // namespace quiver::cli

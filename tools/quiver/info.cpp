#include "commands.h"
namespace quiver::cli {
void register_info(CLI::App& app) { app.add_subcommand("info", "(not yet implemented)"); }
}  // namespace quiver::cli
